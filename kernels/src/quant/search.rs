//! The searching quantizers of the 32-value block formats (Q4_0, Q5_0, Q4_1): for each block, try a range of
//! scales (and minimums), fit each candidate's levels by weighted least squares, and keep the one with the least
//! weighted squared error. The output is the same block format as round-to-nearest gives, so any reader of the
//! format reads it; only the choice of scale and levels differs.
//!
//! The idea is llama.cpp's `make_qx_quants` (symmetric formats) and `make_qkx2_quants` (formats with a minimum),
//! written here for 32-value blocks, with three differences: both signs of the symmetric scale are tried (the
//! largest value may map to the short side of the level range), the error is measured with the scale rounded to
//! f16 as it is stored, and the levels are re-rounded against that stored scale.
//!
//! The per-value weights of the error are the importance of the value's column: the mean square of the activation
//! it multiplies (see `infer::quantize`), or 1. On SmolLM2, llama.cpp's extra factor `sqrt(σ² + x²)` (favouring the
//! values that are large within their row) and weights `x²` both gave a higher KL divergence than plain weights.
//!
//! Speed: the candidates' sums are taken over 16 independent lanes and then added in a fixed tree, so the compiler
//! can vectorize them without reassociating floats: every instruction-set level computes the same bytes. The block
//! functions are compiled once per level (`#[target_feature]` wrappers below) and picked by [`crate::dispatch::isa`].

use half::f16;

use crate::dispatch::Isa;

/// Values per block.
pub const QK: usize = 32;
/// Candidate scales on each side of the plain fit, in steps of a tenth of a level: `2·SPREAD + 1` per sign.
const SPREAD: i32 = 6;
/// Below this magnitude a block is all zeros (as ggml's `GROUP_MAX_EPS`).
const EPS: f32 = 1e-15;

/// Rounds to nearest, ties to even, for |y| < 2²²; written so that it vectorizes on every level.
#[inline(always)]
fn round(y: f32) -> f32 {
    const MAGIC: f32 = 12582912.0;
    (y + MAGIC) - MAGIC
}

#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v < lo { lo } else { v };
    if v > hi { hi } else { v }
}

/// Σ a, over 32 values in a fixed order (16 lanes, then halving).
#[inline(always)]
fn sum32(a: &[f32; QK]) -> f32 {
    let mut s = [0f32; 16];
    for j in 0..16 {
        s[j] = a[j] + a[j + 16];
    }
    let mut n = 8;
    while n > 0 {
        for j in 0..n {
            s[j] += s[j + n];
        }
        n /= 2;
    }
    s[0]
}

/// The error weights of one block: the columns' importance, or 1.
#[inline(always)]
pub(crate) fn block_weights(importance: Option<&[f32]>) -> [f32; QK] {
    match importance {
        Some(imp) => imp.try_into().expect("one importance per value of the block"),
        None => [1.0; QK],
    }
}

/// A symmetric block: `x ≈ d · q` with `q` in `lo..=hi`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Symmetric {
    pub d: f16,
    pub q: [i8; QK],
}

/// A block with a minimum: `x ≈ d · q + m` with `q` in `0..=nmax`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Affine {
    pub d: f16,
    pub m: f16,
    pub q: [u8; QK],
}

/// Levels of `x` against scale `d` (its inverse `id`), clamped to `lo..=hi`, as floats.
#[inline(always)]
fn levels(x: &[f32; QK], id: f32, lo: f32, hi: f32) -> [f32; QK] {
    let mut q = [0f32; QK];
    for j in 0..QK {
        q[j] = clamp(round(x[j] * id), lo, hi);
    }
    q
}

/// Σ w·(x − d·q)².
#[inline(always)]
fn sym_error(x: &[f32; QK], w: &[f32; QK], d: f32, q: &[f32; QK]) -> f32 {
    let mut e = [0f32; QK];
    for j in 0..QK {
        let r = x[j] - d * q[j];
        e[j] = w[j] * r * r;
    }
    sum32(&e)
}

#[inline(always)]
fn symmetric_impl(x: &[f32; QK], w: &[f32; QK], lo: i32, hi: i32) -> Symmetric {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < EPS {
        return Symmetric { d: f16::ZERO, q: [0; QK] };
    }
    let (lo_f, hi_f) = (lo as f32, hi as f32);
    let mut wx = [0f32; QK];
    for j in 0..QK {
        wx[j] = w[j] * x[j];
    }
    // Best candidate so far by Σwxq² / Σwq² (the error it saves), and its least-squares scale.
    let (mut best, mut best_d) = (-1f32, max / lo_f);
    for end in [lo_f, hi_f] {
        for s in -SPREAD..=SPREAD {
            let id = (end + end.signum() * 0.1 * s as f32) / max;
            let q = levels(x, id, lo_f, hi_f);
            let (mut a, mut b) = ([0f32; QK], [0f32; QK]);
            for j in 0..QK {
                a[j] = wx[j] * q[j];
                b[j] = w[j] * q[j] * q[j];
            }
            let (sxq, sqq) = (sum32(&a), sum32(&b));
            if sqq > 0.0 && sxq * sxq > best * sqq {
                best = sxq * sxq / sqq;
                best_d = sxq / sqq;
            }
        }
    }
    // Store the scale as f16 and round the levels against that stored value; then one more least-squares step on
    // those levels, kept if it is better after its own f16 rounding.
    let valid = |d: f16| d.is_finite() && d.to_f32() != 0.0;
    let d0 = f16::from_f32(best_d);
    if !valid(d0) {
        // The scale underflowed f16: the block is (nearly) zero at f16 precision.
        return Symmetric { d: f16::ZERO, q: [0; QK] };
    }
    let mut chosen = (d0, levels(x, 1.0 / d0.to_f32(), lo_f, hi_f));
    let (mut a, mut b) = ([0f32; QK], [0f32; QK]);
    for j in 0..QK {
        a[j] = wx[j] * chosen.1[j];
        b[j] = w[j] * chosen.1[j] * chosen.1[j];
    }
    let (sxq, sqq) = (sum32(&a), sum32(&b));
    let d1 = f16::from_f32(if sqq > 0.0 { sxq / sqq } else { 0.0 });
    if valid(d1) && d1 != d0 {
        let q1 = levels(x, 1.0 / d1.to_f32(), lo_f, hi_f);
        if sym_error(x, w, d1.to_f32(), &q1) < sym_error(x, w, d0.to_f32(), &chosen.1) {
            chosen = (d1, q1);
        }
    }
    let (d, q) = chosen;
    let mut out = [0i8; QK];
    for j in 0..QK {
        out[j] = q[j] as i8;
    }
    Symmetric { d, q: out }
}

/// Levels of `x` against `d` and `m` (inverse scale `id`), clamped to `0..=nmax`, as floats.
#[inline(always)]
fn affine_levels(x: &[f32; QK], m: f32, id: f32, nmax: f32) -> [f32; QK] {
    let mut q = [0f32; QK];
    for j in 0..QK {
        q[j] = clamp(round((x[j] - m) * id), 0.0, nmax);
    }
    q
}

/// Σ w·(x − d·q − m)².
#[inline(always)]
fn affine_error(x: &[f32; QK], w: &[f32; QK], d: f32, m: f32, q: &[f32; QK]) -> f32 {
    let mut e = [0f32; QK];
    for j in 0..QK {
        let r = x[j] - d * q[j] - m;
        e[j] = w[j] * r * r;
    }
    sum32(&e)
}

/// The weighted least-squares `(d, m)` for levels `q`, or `None` if the levels do not determine them.
#[inline(always)]
fn affine_fit(w: &[f32; QK], wx: &[f32; QK], sw: f32, swx: f32, q: &[f32; QK]) -> Option<(f32, f32)> {
    let (mut a, mut b, mut c) = ([0f32; QK], [0f32; QK], [0f32; QK]);
    for j in 0..QK {
        a[j] = w[j] * q[j];
        b[j] = a[j] * q[j];
        c[j] = wx[j] * q[j];
    }
    let (swq, swqq, swxq) = (sum32(&a), sum32(&b), sum32(&c));
    let det = sw * swqq - swq * swq;
    if det <= 0.0 {
        return None;
    }
    Some(((sw * swxq - swx * swq) / det, (swqq * swx - swq * swxq) / det))
}

#[inline(always)]
fn affine_impl(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
    let (mut min, mut max) = (x[0], x[0]);
    for &v in x {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
    }
    let nmax_f = nmax as f32;
    if max - min < EPS {
        return Affine { d: f16::ZERO, m: f16::from_f32(min), q: [0; QK] };
    }
    let mut wx = [0f32; QK];
    for j in 0..QK {
        wx[j] = w[j] * x[j];
    }
    let (sw, swx) = (sum32(w), sum32(&wx));
    // The plain min/max fit is the starting point; each candidate's levels get their least-squares (d, m).
    let (mut best_d, mut best_m) = ((max - min) / nmax_f, min);
    let mut best = affine_error(x, w, best_d, best_m, &affine_levels(x, min, 1.0 / best_d, nmax_f));
    for s in -2 * SPREAD..=SPREAD {
        let id = (nmax_f + 0.1 * s as f32) / (max - min);
        let q = affine_levels(x, min, id, nmax_f);
        if let Some((d, m)) = affine_fit(w, &wx, sw, swx, &q) {
            let err = affine_error(x, w, d, m, &q);
            if err < best {
                (best, best_d, best_m) = (err, d, m);
            }
        }
    }
    // Round (d, m) to f16 as stored, re-round the levels against them, and try one more least-squares step.
    let finish = |d: f32, m: f32| -> Option<(f16, f16, [f32; QK], f32)> {
        let (d16, m16) = (f16::from_f32(d), f16::from_f32(m));
        if !(d16.is_finite() && m16.is_finite()) || d16.to_f32() <= 0.0 {
            return None;
        }
        let q = affine_levels(x, m16.to_f32(), 1.0 / d16.to_f32(), nmax_f);
        Some((d16, m16, q, affine_error(x, w, d16.to_f32(), m16.to_f32(), &q)))
    };
    let Some(mut chosen) = finish(best_d, best_m) else {
        // The scale underflowed f16: every value is the minimum at f16 precision.
        return Affine { d: f16::ZERO, m: f16::from_f32(min), q: [0; QK] };
    };
    if let Some((d, m)) = affine_fit(w, &wx, sw, swx, &chosen.2)
        && let Some(next) = finish(d, m)
        && next.3 < chosen.3
    {
        chosen = next;
    }
    let mut q = [0u8; QK];
    for j in 0..QK {
        q[j] = chosen.2[j] as u8;
    }
    Affine { d: chosen.0, m: chosen.1, q }
}

// One compiled copy of each block function per instruction-set level: the `#[inline(always)]` bodies above are
// vectorized for the features of the function they are inlined into.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn symmetric_avx2(x: &[f32; QK], w: &[f32; QK], lo: i32, hi: i32) -> Symmetric {
        symmetric_impl(x, w, lo, hi)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub fn symmetric_avx512(x: &[f32; QK], w: &[f32; QK], lo: i32, hi: i32) -> Symmetric {
        symmetric_impl(x, w, lo, hi)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn affine_avx2(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
        affine_impl(x, w, nmax)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub fn affine_avx512(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
        affine_impl(x, w, nmax)
    }
}

/// The best symmetric block for `x` under weights `w`, levels in `lo..=hi` (see the module notes).
pub(crate) fn symmetric(x: &[f32; QK], w: &[f32; QK], lo: i32, hi: i32) -> Symmetric {
    match crate::dispatch::isa() {
        // SAFETY: `isa()` only returns a level whose features the CPU was checked to have (`Isa::is_supported`),
        // and the wrapper enables no feature beyond that level's.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::symmetric_avx512(x, w, lo, hi) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::symmetric_avx2(x, w, lo, hi) },
        _ => symmetric_impl(x, w, lo, hi),
    }
}

/// The best block with a minimum for `x` under weights `w`, levels in `0..=nmax` (see the module notes).
pub(crate) fn affine(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
    match crate::dispatch::isa() {
        // SAFETY: as in `symmetric`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::affine_avx512(x, w, nmax) },
        // SAFETY: as in `symmetric`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::affine_avx2(x, w, nmax) },
        _ => affine_impl(x, w, nmax),
    }
}

/// Runs `f(block, its weights)` for every 32-value block of `x`, with the weights of [`block_weights`].
/// `importance`, if given, has one value per value of `x`.
pub(crate) fn for_blocks(x: &[f32], importance: Option<&[f32]>, mut f: impl FnMut(usize, &[f32; QK], &[f32; QK])) {
    assert!(x.len().is_multiple_of(QK), "{} values are not whole blocks of {QK}", x.len());
    if let Some(imp) = importance {
        assert_eq!(imp.len(), x.len(), "one importance per value");
    }
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let xb: &[f32; QK] = xb.try_into().expect("chunks of QK");
        f(b, xb, &block_weights(importance.map(|i| &i[b * QK..(b + 1) * QK])));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn sum32_is_the_sum() {
        let a: [f32; QK] = std::array::from_fn(|j| j as f32);
        assert_eq!(sum32(&a), (0..32).sum::<i32>() as f32);
    }

    #[test]
    fn every_level_gives_the_same_blocks() {
        eprintln!("levels compared: {:?}", Isa::available());
        let mut seed = 7;
        for _ in 0..200 {
            let x: [f32; QK] = std::array::from_fn(|_| lcg(&mut seed) * (1.0 + lcg(&mut seed)));
            let w: [f32; QK] = std::array::from_fn(|_| 1.0 + lcg(&mut seed));
            let (s, a) = (symmetric_impl(&x, &w, -8, 7), affine_impl(&x, &w, 15));
            for isa in Isa::available() {
                let (s2, a2) = match isa {
                    // SAFETY: `available()` lists only levels this CPU supports.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => unsafe { (x86::symmetric_avx512(&x, &w, -8, 7), x86::affine_avx512(&x, &w, 15)) },
                    // SAFETY: as above.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => unsafe { (x86::symmetric_avx2(&x, &w, -8, 7), x86::affine_avx2(&x, &w, 15)) },
                    _ => (symmetric_impl(&x, &w, -8, 7), affine_impl(&x, &w, 15)),
                };
                assert_eq!((s.d.to_bits(), s.q), (s2.d.to_bits(), s2.q), "{isa}");
                assert_eq!((a.d.to_bits(), a.m.to_bits(), a.q), (a2.d.to_bits(), a2.m.to_bits(), a2.q), "{isa}");
            }
        }
    }
}
