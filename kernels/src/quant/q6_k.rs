//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16; `x = d * sc * (q - 32)`, `q` in 0..=63, with a
//! signed 8-bit scale `sc` per sub-block. 6.5625 bits per weight.
//!
//! Byte-identical to ggml's `block_q6_K` (GGUF type 14). Each 128-weight half `n` uses `ql[64n..64n+64]` and
//! `qh[32n..32n+32]`: for `l` in 0..32, weights `128n + l`, `+32`, `+64`, `+96` take their low four bits from
//! `ql[64n + l] & 0xF`, `ql[64n + l + 32] & 0xF`, `ql[64n + l] >> 4`, `ql[64n + l + 32] >> 4`, and their high two
//! bits from bit pairs 0, 2, 4, 6 of `qh[32n + l]`. Dotted against Q8_K activations.

use half::f16;

use super::k_quants::{GROUP_MAX_EPS, QK_K, make_qx_quants, nearest_int};
use super::q8_k::BlockQ8K;

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low four bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High two bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// The 256 quants of a super-block, each in 0..=63 (before subtracting 32), in weight order.
fn unpack(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..QK_K / 128 {
        let (ql, qh) = (&b.ql[64 * n..64 * n + 64], &b.qh[32 * n..32 * n + 32]);
        for l in 0..32 {
            let base = 128 * n + l;
            q[base] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[base + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Dequantizes `x` into `y` (`x.len() * 256` values): `y = d * sc * (q - 32)` per sub-block of 16.
///
/// # Panics
/// If `y.len() != x.len() * 256`.
pub fn dequantize_row_ref(x: &[BlockQ6K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "Q6_K dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        let q = unpack(xb);
        for (j, (ys, qs)) in yb.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * xb.scales[j] as f32;
            for (out, &qi) in ys.iter_mut().zip(qs) {
                *out = dl * (qi as i32 - 32) as f32;
            }
        }
    }
}

/// Dot product of Q6_K weights with Q8_K activations. Per super-block, the exact integer sum
/// `Σ_j sc_j * Σ_{i in j} (q_i - 32) * a_i` over the sixteen sub-blocks of 16, times `da * d`, accumulated in f32
/// super-block by super-block. (A SIMD kernel may compute `Σ q*a - 32 * bsums`; the integers are equal.)
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q6_k_q8_k_ref(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q6_k_q8_k: {} weight blocks, {} activation blocks", w.len(), a.len());
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let q = unpack(wb);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            let dot: i32 = (16 * j..16 * j + 16).map(|i| (q[i] as i32 - 32) * ab.qs[i] as i32).sum();
            sumi += wb.scales[j] as i32 * dot;
        }
        sum += (ab.d * wb.d.to_f32()) * sumi as f32;
    }
    sum
}

/// Quantizes `x` (`y.len() * 256` values) into `y`, as ggml's `quantize_row_q6_K_ref`:
/// 1. each sub-block of 16 gets a signed scale from `make_qx_quants` (levels -32..=31, weights `x²`);
/// 2. the scale of largest magnitude (sign kept) maps to -128: `d = max_scale / -128`, and each sub-block scale is
///    stored as `min(127, nearest_int(scale / d))`;
/// 3. every weight is re-rounded against its sub-block's quantized scale.
///
/// A super-block whose scales are all (nearly) zero is stored as all zeros.
///
/// # Panics
/// If `x.len() != y.len() * 256`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ6K]) {
    quantize_row_impl(x, None, y)
}

/// [`quantize_row_ref`] with each value's weight `x²` multiplied by its `importance` (one per value), so the
/// sub-block scales favour the values that matter most to the model's outputs.
///
/// # Panics
/// If `x.len() != y.len() * 256` or `importance.len() != x.len()`.
pub fn quantize_row_weighted(x: &[f32], importance: &[f32], y: &mut [BlockQ6K]) {
    assert_eq!(importance.len(), x.len(), "Q6_K quantize: one importance per value");
    quantize_row_impl(x, Some(importance), y)
}

fn quantize_row_impl(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ6K]) {
    assert_eq!(x.len(), y.len() * QK_K, "Q6_K quantize: {} values for {} blocks", x.len(), y.len());
    for (n, (xb, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (j, (xs, ls)) in xb.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
            let base = n * QK_K + 16 * j;
            let weights: [f32; 16] = std::array::from_fn(|i| match importance {
                None => xs[i] * xs[i],
                Some(imp) => xs[i] * xs[i] * imp[base + i],
            });
            scales[j] = make_qx_quants(32, xs, &weights, ls);
            if scales[j].abs() > max_abs_scale {
                max_abs_scale = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *yb = BlockQ6K { ql: [0; QK_K / 2], qh: [0; QK_K / 4], scales: [0; QK_K / 16], d: f16::ZERO };
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb.d = f16::from_f32(1.0 / iscale);
        for (stored, &scale) in yb.scales.iter_mut().zip(&scales) {
            // In -128..=127: |iscale * scale| <= 128, and only the largest (which maps to -128) reaches 128.
            *stored = nearest_int(iscale * scale).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * yb.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(xb[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for n in 0..QK_K / 128 {
            let (ql, qh) = (&mut yb.ql[64 * n..64 * n + 64], &mut yb.qh[32 * n..32 * n + 32]);
            for i in 0..32 {
                let q = |k: usize| l[128 * n + 32 * k + i] as u8;
                ql[i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                ql[i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_round_trip_through_packing() {
        // Give sub-block j of 16 weights the value (j + 1) * (level - 32) / 64 for level = i % 64, so each
        // sub-block has its own scale and each weight its own level; the dequantized values must come back in
        // the same positions (a misplaced nibble or bit pair would move them).
        let x: Vec<f32> = (0..QK_K).map(|i| ((i / 16 + 1) as f32) * ((i % 64) as f32 - 32.0) / 64.0).collect();
        let mut b = [BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO }];
        quantize_row_ref(&x, &mut b);
        let mut y = vec![0.0f32; QK_K];
        dequantize_row_ref(&b, &mut y);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= 0.02 * (i / 16 + 1) as f32, "weight {i}: {a} vs {b}");
        }
    }
}
