//! Shared geometry of the K-quant super-blocks (Q2_K, Q4_K, Q6_K, Q8_K): 256 weights per super-block.

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Rounds to the nearest integer, ties to even: the result of ggml's `nearest_int`, which adds 1.5 * 2^23 and reads
/// the mantissa, so it rounds in the FPU's default mode. The K-quant quantizers must round this way (not half away
/// from zero, as `f32::round` does) to produce the same bytes as llama.cpp.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// The 6-bit scale and 6-bit min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K (ggml's
/// `get_scale_min_k4`). Layout: bytes 0..4 hold the scales of sub-blocks 0..4 in their low 6 bits, bytes 4..8 the
/// mins of sub-blocks 0..4 likewise; sub-blocks 4..8 keep their low nibbles in bytes 8..12 (scale low, min high) and
/// their top two bits in the spare top bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc, m)
    }
}

/// Below this, ggml treats a group of weights as all zero (`GROUP_MAX_EPS` in ggml-quants.c).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Chooses a scale and a minimum for one sub-block and its quants `l[i]` in `0..=nmax`, so that
/// `x[i] ≈ scale * l[i] - the_min`: ggml's `make_qkx2_quants`, used by the Q2_K and Q4_K reference quantizers.
/// Returns `(scale, the_min)`; `the_min >= 0` (the offset is never positive, so an all-positive sub-block uses
/// offset 0).
///
/// The search: start from the plain min/max fit, then try `nstep + 1` candidate inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)`; for each, round to get levels, then solve the weighted
/// least-squares problem for `(scale, min)` given those levels in closed form, and keep the candidate with the
/// least weighted error (absolute error if `use_mad`, squared otherwise). The float operations are written in
/// the same order as ggml's so the result is bit-identical; that is why the expressions are left unsimplified.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    debug_assert!(n > 0 && weights.len() == n && l.len() == n);
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        best_error += weights[i] * err(scale * l[i] as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; QK_K];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let (w, lf) = (weights[i], li as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        // Weighted least squares for x ≈ scale * l + min: the 2x2 normal equations' determinant and solution.
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Chooses a signed scale for one sub-block and its quants `l[i]` in `0..2*nmax` (stored offset by `nmax`), so
/// that `x[i] ≈ scale * (l[i] - nmax)`: ggml's `make_qx_quants` with `rmse_type = 1`, used by the Q6_K reference
/// quantizer with weights `w = x²` (the weighted quantizer multiplies them by the values' importance). As with Q4_0, the value of largest magnitude (sign kept) maps to
/// `-nmax`, which gains a level on its side. Then 18 nearby inverse scales `-(nmax + 0.1 * is) / max` are tried;
/// for each, the least-squares scale given the levels is `Σ w x l / Σ w l²`, and the candidate maximising
/// `(Σ w x l)² / Σ w l²` (equivalently, minimising the weighted squared error) wins. Float operations in ggml's
/// order, for bit-identical results.
pub fn make_qx_quants(nmax: i32, x: &[f32], weights: &[f32], l: &mut [i8]) -> f32 {
    debug_assert!(x.len() == l.len() && weights.len() == x.len());
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for ((li, &v), &w) in l.iter_mut().zip(x).zip(weights) {
        let q = level(iscale, v);
        *li = (q + nmax) as i8;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (&v, &w) in x.iter().zip(weights) {
            let q = level(iscale, v) as f32;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}
