//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16; `x = d * sc * q - dmin * m`, `q` in 0..=3, with a
//! 4-bit scale `sc` and 4-bit min `m` per sub-block. 2.625 bits per weight.
//!
//! Byte-identical to ggml's `block_q2_K` (GGUF type 10). `scales[i]` holds sub-block `i`'s scale (low nibble) and
//! min (high nibble). `qs` packs four 2-bit quants per byte: for each 128-weight half `n` (bytes `32n..32n+32`),
//! bit pair `2s` of byte `32n + l` is weight `128n + 32s + l`. Dotted against Q8_K activations.

use half::f16;

use super::k_quants::{QK_K, make_qkx2_quants, nearest_int};
use super::q8_k::BlockQ8K;

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Per-sub-block 4-bit scale (low nibble) and 4-bit min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// The 256 quants of a super-block, each in 0..=3, in weight order.
fn unpack(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..QK_K / 128 {
        for s in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * s + l] = (b.qs[32 * n + l] >> (2 * s)) & 3;
            }
        }
    }
    q
}

/// Dequantizes `x` into `y` (`x.len() * 256` values): `y = d * sc * q - dmin * m` per sub-block of 16.
///
/// # Panics
/// If `y.len() != x.len() * 256`.
pub fn dequantize_row_ref(x: &[BlockQ2K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "Q2_K dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (xb.d.to_f32(), xb.dmin.to_f32());
        let q = unpack(xb);
        for (j, (ys, qs)) in yb.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * (xb.scales[j] & 0xF) as f32;
            let ml = dmin * (xb.scales[j] >> 4) as f32;
            for (out, &qi) in ys.iter_mut().zip(qs) {
                *out = dl * qi as f32 - ml;
            }
        }
    }
}

/// Dot product of Q2_K weights with Q8_K activations. Per super-block, two exact integer sums:
/// `Σ_j sc_j * Σ_{i in j} q_i * a_i` and `Σ_j m_j * bsums_j`; the result is
/// `(da * d) * first - (da * dmin) * second`, accumulated in f32 super-block by super-block. The activations'
/// `bsums` must be the sums of their quants (as `q8_k::quantize_row_ref` writes them).
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q2_k_q8_k_ref(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q2_k_q8_k: {} weight blocks, {} activation blocks", w.len(), a.len());
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let q = unpack(wb);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..QK_K / 16 {
            let dot: i32 = (16 * j..16 * j + 16).map(|i| q[i] as i32 * ab.qs[i] as i32).sum();
            sumi += (wb.scales[j] & 0xF) as i32 * dot;
            summ += (wb.scales[j] >> 4) as i32 * ab.bsums[j] as i32;
        }
        sum += (ab.d * wb.d.to_f32()) * sumi as f32 - (ab.d * wb.dmin.to_f32()) * summ as f32;
    }
    sum
}

/// Quantizes `x` (`y.len() * 256` values) into `y`, as ggml's `quantize_row_q2_K_ref`:
/// 1. each sub-block of 16 gets a scale and min from `make_qkx2_quants` (levels 0..=3, weights `|x|`, minimising
///    absolute error over 16 candidate scales);
/// 2. the sixteen scales are quantized to 4 bits against `d = max_scale / 15`, the mins likewise against
///    `dmin = max_min / 15`;
/// 3. every weight is re-rounded against its sub-block's *quantized* scale and min, so the stored levels fit the
///    stored scales rather than the unquantized ones.
///
/// # Panics
/// If `x.len() != y.len() * 256`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ2K]) {
    quantize_row_impl(x, None, y)
}

/// [`quantize_row_ref`] with each value's weight `|x|` multiplied by its `importance` (one per value).
///
/// # Panics
/// If `x.len() != y.len() * 256` or `importance.len() != x.len()`.
pub fn quantize_row_weighted(x: &[f32], importance: &[f32], y: &mut [BlockQ2K]) {
    assert_eq!(importance.len(), x.len(), "Q2_K quantize: one importance per value");
    quantize_row_impl(x, Some(importance), y)
}

fn quantize_row_impl(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ2K]) {
    assert_eq!(x.len(), y.len() * QK_K, "Q2_K quantize: {} values for {} blocks", x.len(), y.len());
    const Q4SCALE: f32 = 15.0;
    for (n, (xb, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0.0f32; QK_K / 16], [0.0f32; QK_K / 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for (j, (xs, ls)) in xb.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
            let weights: [f32; 16] = std::array::from_fn(|i| match importance {
                None => xs[i].abs(),
                Some(imp) => xs[i].abs() * imp[n * QK_K + 16 * j + i],
            });
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, ls, -0.5, 0.1, 15, true);
            max_scale = max_scale.max(scales[j]);
            max_min = max_min.max(mins[j]);
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (packed, &scale) in yb.scales.iter_mut().zip(&scales) {
                // At most 15 (scale <= max_scale); `as u8` keeps the low byte as ggml's uint8_t store does.
                *packed = nearest_int(iscale * scale) as u8;
            }
            yb.d = f16::from_f32(max_scale / Q4SCALE);
        } else {
            yb.scales = [0; QK_K / 16];
            yb.d = f16::ZERO;
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (packed, &min) in yb.scales.iter_mut().zip(&mins) {
                *packed |= (nearest_int(iscale * min) << 4) as u8;
            }
            yb.dmin = f16::from_f32(max_min / Q4SCALE);
        } else {
            yb.dmin = f16::ZERO;
        }
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * (yb.scales[j] & 0xF) as f32;
            if d == 0.0 {
                // Keep the levels from step 1: with a zero scale they dequantize to -dm whatever they are.
                continue;
            }
            let dm = yb.dmin.to_f32() * (yb.scales[j] >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((xb[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for n in 0..QK_K / 128 {
            for i in 0..32 {
                let base = 128 * n + i;
                yb.qs[32 * n + i] = l[base] | (l[base + 32] << 2) | (l[base + 64] << 4) | (l[base + 96] << 6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_levels_round_trip() {
        // Sub-block j holds the four values 0, s, 2s, 3s in a position-dependent order, with s = k/10 for an
        // integer k in 5..=15: the largest scale (1.5) over 15 gives d = 0.1, so every s is an exact 4-bit multiple
        // of d and Q2_K represents the data up to the f16 rounding of d. Positions must survive the 2-bit packing.
        let x: Vec<f32> =
            (0..QK_K).map(|i| ((i * 7 + i / 16) % 4) as f32 * (5 + (i / 16) % 11) as f32 / 10.0).collect();
        let mut b = [BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO }];
        quantize_row_ref(&x, &mut b);
        let mut y = vec![0.0f32; QK_K];
        dequantize_row_ref(&b, &mut y);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= 1e-3 * a.abs().max(1.0), "weight {i}: {a} vs {b}");
        }
    }
}
