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
//! Speed: the symmetric search (Q4_0, Q5_0) runs many blocks at once, one per SIMD lane ([`super::search_sym`]). The
//! search with a minimum (Q4_1) works within a block: its work per candidate is three primitives ([`Lanes`]):
//! levels, weighted sums and the weighted error. [`Scalar`] states them; [`x86::Avx2`] computes them with 256-bit
//! vectors in the same order (the sums over 16 lanes, then halving; no fused multiply-adds), so every
//! instruction-set level writes the same bytes. The AVX2 level is also used on AVX-512 machines.

use half::f16;

use crate::dispatch::Isa;

/// Values per block.
pub const QK: usize = 32;
/// Candidate scales on each side of the plain fit, in steps of a tenth of a level: `2·SPREAD + 1` per sign. With
/// importance weights, SmolLM2 q4_0's KLD on held-out text was 0.246 with 6, 0.255 with 3, 0.262 with 1 and 0.265
/// with 0 (round to nearest: 0.403); 1 keeps the search within llama-quantize's time.
pub(crate) const SPREAD: i32 = 1;
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
#[derive(Debug, Clone, Copy, Default)]
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

/// The per-block primitives of the search, one implementation per instruction-set level; every implementation
/// computes exactly the same floats (the scalar one states the order).
pub(crate) trait Lanes: Copy {
    /// `clamp(round((x − m) · id), 0, nmax)`.
    fn affine_levels(self, x: &[f32; QK], m: f32, id: f32, nmax: f32) -> [f32; QK];
    /// `(Σ w·q, Σ (w·q)·q, Σ wx·q)`.
    fn sums3(self, wx: &[f32; QK], w: &[f32; QK], q: &[f32; QK]) -> (f32, f32, f32);
    /// `Σ (w·r)·r` with `r = (x − d·q) − m`.
    fn error(self, x: &[f32; QK], w: &[f32; QK], d: f32, m: f32, q: &[f32; QK]) -> f32;
}

/// The portable statement of [`Lanes`].
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

impl Lanes for Scalar {
    #[inline(always)]
    fn affine_levels(self, x: &[f32; QK], m: f32, id: f32, nmax: f32) -> [f32; QK] {
        std::array::from_fn(|j| clamp(round((x[j] - m) * id), 0.0, nmax))
    }

    #[inline(always)]
    fn sums3(self, wx: &[f32; QK], w: &[f32; QK], q: &[f32; QK]) -> (f32, f32, f32) {
        let a: [f32; QK] = std::array::from_fn(|j| w[j] * q[j]);
        let b: [f32; QK] = std::array::from_fn(|j| a[j] * q[j]);
        let c: [f32; QK] = std::array::from_fn(|j| wx[j] * q[j]);
        (sum32(&a), sum32(&b), sum32(&c))
    }

    #[inline(always)]
    fn error(self, x: &[f32; QK], w: &[f32; QK], d: f32, m: f32, q: &[f32; QK]) -> f32 {
        let e: [f32; QK] = std::array::from_fn(|j| {
            let r = x[j] - d * q[j] - m;
            w[j] * r * r
        });
        sum32(&e)
    }
}

/// The weighted least-squares `(d, m)` for levels `q`, or `None` if the levels do not determine them.
#[inline(always)]
fn affine_fit<L: Lanes>(l: L, w: &[f32; QK], wx: &[f32; QK], sw: f32, swx: f32, q: &[f32; QK]) -> Option<(f32, f32)> {
    let (swq, swqq, swxq) = l.sums3(wx, w, q);
    let det = sw * swqq - swq * swq;
    if det <= 0.0 {
        return None;
    }
    Some(((sw * swxq - swx * swq) / det, (swqq * swx - swq * swxq) / det))
}

#[inline(always)]
fn affine_impl<L: Lanes>(l: L, x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
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
    let mut best = l.error(x, w, best_d, best_m, &l.affine_levels(x, min, 1.0 / best_d, nmax_f));
    for s in -2 * SPREAD..=SPREAD {
        let id = (nmax_f + 0.1 * s as f32) / (max - min);
        let q = l.affine_levels(x, min, id, nmax_f);
        if let Some((d, m)) = affine_fit(l, w, &wx, sw, swx, &q) {
            let err = l.error(x, w, d, m, &q);
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
        let q = l.affine_levels(x, m16.to_f32(), 1.0 / d16.to_f32(), nmax_f);
        Some((d16, m16, q, l.error(x, w, d16.to_f32(), m16.to_f32(), &q)))
    };
    let Some(mut chosen) = finish(best_d, best_m) else {
        // The scale underflowed f16: every value is the minimum at f16 precision.
        return Affine { d: f16::ZERO, m: f16::from_f32(min), q: [0; QK] };
    };
    if let Some((d, m)) = affine_fit(l, w, &wx, sw, swx, &chosen.2)
        && let Some(next) = finish(d, m)
        && next.3 < chosen.3
    {
        chosen = next;
    }
    let mut q = [0u8; QK];
    for (o, &v) in q.iter_mut().zip(&chosen.2) {
        *o = v as u8;
    }
    Affine { d: chosen.0, m: chosen.1, q }
}

// The AVX2 primitives, and the block functions compiled with them.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`Lanes`] with 256-bit vectors. Only [`affine_avx2`] makes one, and it runs only on CPUs with AVX2 (its
    /// callers check), so the intrinsics below always have their features.
    #[derive(Clone, Copy)]
    pub struct Avx2(());

    // No closures below (`array::from_fn`, `map`): a closure is compiled without its caller's target features, so
    // the intrinsics in it would become calls.

    /// Loads block `x` as four vectors.
    #[inline(always)]
    fn load(x: &[f32; QK]) -> [__m256; 4] {
        // SAFETY: each load reads 8 floats inside the 32-float array; no alignment is required. AVX is available
        // (see `Avx2`).
        unsafe {
            let p = x.as_ptr();
            [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
        }
    }

    #[inline(always)]
    fn store(v: [__m256; 4]) -> [f32; QK] {
        let mut out = [0f32; QK];
        let p = out.as_mut_ptr();
        // SAFETY: 8 floats each, inside the 32-float array; AVX is available (see `Avx2`).
        unsafe {
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
            _mm256_storeu_ps(p.add(16), v[2]);
            _mm256_storeu_ps(p.add(24), v[3]);
        }
        out
    }

    /// [`sum32`] of the four vectors, in its order: lanes j and j+16, then halving 8, 4, 2, 1.
    #[inline(always)]
    fn sum(v: [__m256; 4]) -> f32 {
        // SAFETY: AVX is available (see `Avx2`).
        unsafe {
            let t = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
            let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            let w = _mm_add_ps(u, _mm_movehl_ps(u, u));
            _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)))
        }
    }

    /// `clamp(round(v), lo, hi)`, rounding as [`round`] does.
    #[inline(always)]
    fn round_clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
        // SAFETY: AVX is available (see `Avx2`).
        unsafe {
            let magic = _mm256_set1_ps(12582912.0);
            let r = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
            // max(r, lo) is `r < lo ? lo : r` and min(·, hi) is `· > hi ? hi : ·` for the non-NaN values here.
            _mm256_min_ps(_mm256_max_ps(r, lo), hi)
        }
    }

    impl Lanes for Avx2 {
        #[inline(always)]
        fn affine_levels(self, x: &[f32; QK], m: f32, id: f32, nmax: f32) -> [f32; QK] {
            let mut v = load(x);
            // SAFETY: AVX is available (see `Avx2`).
            unsafe {
                let (mv, idv) = (_mm256_set1_ps(m), _mm256_set1_ps(id));
                let (zero, nv) = (_mm256_setzero_ps(), _mm256_set1_ps(nmax));
                for r in &mut v {
                    *r = round_clamp(_mm256_mul_ps(_mm256_sub_ps(*r, mv), idv), zero, nv);
                }
            }
            store(v)
        }

        #[inline(always)]
        fn sums3(self, wx: &[f32; QK], w: &[f32; QK], q: &[f32; QK]) -> (f32, f32, f32) {
            let (wx, w, q) = (load(wx), load(w), load(q));
            let (mut a, mut b, mut c) = (wx, w, q);
            // SAFETY: AVX is available (see `Avx2`).
            unsafe {
                for k in 0..4 {
                    a[k] = _mm256_mul_ps(w[k], q[k]);
                    b[k] = _mm256_mul_ps(a[k], q[k]);
                    c[k] = _mm256_mul_ps(wx[k], q[k]);
                }
            }
            (sum(a), sum(b), sum(c))
        }

        #[inline(always)]
        fn error(self, x: &[f32; QK], w: &[f32; QK], d: f32, m: f32, q: &[f32; QK]) -> f32 {
            let (x, w, q) = (load(x), load(w), load(q));
            let mut e = x;
            // SAFETY: AVX is available (see `Avx2`).
            unsafe {
                let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
                for k in 0..4 {
                    let r = _mm256_sub_ps(_mm256_sub_ps(x[k], _mm256_mul_ps(dv, q[k])), mv);
                    e[k] = _mm256_mul_ps(_mm256_mul_ps(w[k], r), r);
                }
            }
            sum(e)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn affine_avx2(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
        affine_impl(Avx2(()), x, w, nmax)
    }
}

/// Whether the AVX2 primitives can run (the chosen level is AVX2 or above).
fn use_avx2() -> bool {
    matches!(crate::dispatch::isa().vectors(), Isa::Avx2 | Isa::Avx512)
}

/// The best block with a minimum for `x` under weights `w`, levels in `0..=nmax` (see the module notes).
pub(crate) fn affine(x: &[f32; QK], w: &[f32; QK], nmax: i32) -> Affine {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: as in `symmetric`.
        return unsafe { x86::affine_avx2(x, w, nmax) };
    }
    affine_impl(Scalar, x, w, nmax)
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
    fn every_level_gives_the_same_affine_blocks() {
        let avx2 = Isa::Avx2.is_supported();
        eprintln!("levels compared: scalar{}", if avx2 { " and avx2" } else { " only (no AVX2 here)" });
        let mut seed = 7;
        for _ in 0..500 {
            let x: [f32; QK] = std::array::from_fn(|_| lcg(&mut seed) * (1.0 + lcg(&mut seed)));
            let w: [f32; QK] = std::array::from_fn(|_| 1.0 + lcg(&mut seed));
            let a = affine_impl(Scalar, &x, &w, 15);
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2, FMA and F16C (`Isa::Avx2.is_supported()`).
                let a2 = unsafe { x86::affine_avx2(&x, &w, 15) };
                assert_eq!((a.d.to_bits(), a.m.to_bits(), a.q), (a2.d.to_bits(), a2.m.to_bits(), a2.q));
            }
        }
    }

    #[test]
    fn search_beats_rounding_and_recovers_a_grid() {
        let mut seed = 11;
        let (mut e_rtn, mut e_search) = (0f32, 0f32);
        for _ in 0..200 {
            let x: [f32; QK] = std::array::from_fn(|_| lcg(&mut seed) * (1.0 + 4.0 * lcg(&mut seed).abs()));
            let w = [1f32; QK];
            let mut s = [Symmetric::default()];
            crate::quant::search_sym::symmetric_blocks_at(Isa::Scalar, &x, None, -8, 7, &mut s);
            let s = s[0];
            let q: [f32; QK] = std::array::from_fn(|j| s.q[j] as f32);
            e_search += Scalar.error(&x, &w, s.d.to_f32(), 0.0, &q);
            let mut b = [crate::quant::BlockQ4_0::default()];
            crate::quant::q4_0::quantize_row_ref(&x, &mut b);
            let mut y = [0f32; QK];
            crate::quant::q4_0::dequantize_row_ref(&b, &mut y);
            e_rtn += x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>();
        }
        assert!(e_search < 0.95 * e_rtn, "search {e_search} vs round-to-nearest {e_rtn}");
        // Values on an affine grid (f16-exact scale and minimum) come back exactly.
        let x: [f32; QK] = std::array::from_fn(|j| -0.75 + 0.125 * ((j * 7) % 16) as f32);
        let a = affine_impl(Scalar, &x, &[1.0; QK], 15);
        let y: [f32; QK] = std::array::from_fn(|j| a.d.to_f32() * a.q[j] as f32 + a.m.to_f32());
        assert_eq!(y, x);
    }
}
