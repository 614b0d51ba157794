//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, `q` in 0..=15, with a
//! 6-bit scale `sc` and 6-bit min `m` per sub-block. 4.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_K` (GGUF type 12). The eight 6-bit scales and eight 6-bit mins are packed
//! into 12 bytes (`scales`): for sub-block `j < 4`, `sc = scales[j] & 63`, `m = scales[j + 4] & 63`; for `j >= 4`,
//! `sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4)` and `m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)`.
//! `qs` holds 64-weight chunks of 32 bytes: byte `l` of chunk `c` has weight `64c + l` (low nibble) and
//! `64c + 32 + l` (high nibble). Dotted against Q8_K activations.

use half::f16;

use super::k_quants::{K_SCALE_SIZE, QK_K, get_scale_min_k4, make_qkx2_quants, nearest_int};
use super::q8_k::BlockQ8K;

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// The 256 quants of a super-block, each in 0..=15, in weight order.
fn unpack(b: &BlockQ4K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            q[64 * c + l] = b.qs[32 * c + l] & 0xF;
            q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
        }
    }
    q
}

/// Dequantizes `x` into `y` (`x.len() * 256` values): `y = d * sc * q - dmin * m` per sub-block of 32.
///
/// # Panics
/// If `y.len() != x.len() * 256`.
pub fn dequantize_row_ref(x: &[BlockQ4K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "Q4_K dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (xb.d.to_f32(), xb.dmin.to_f32());
        let q = unpack(xb);
        for (j, (ys, qs)) in yb.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (sc, m) = get_scale_min_k4(j, &xb.scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for (out, &qi) in ys.iter_mut().zip(qs) {
                *out = dl * qi as f32 - ml;
            }
        }
    }
}

/// Dot product of Q4_K weights with Q8_K activations. Per super-block, two exact integer sums:
/// `Σ_j sc_j * Σ_{i in j} q_i * a_i` over the eight sub-blocks of 32, and `Σ_j m_j * (bsums_2j + bsums_2j+1)`;
/// the result is `(da * d) * first - (da * dmin) * second`, accumulated in f32 super-block by super-block. The
/// activations' `bsums` must be the sums of their quants.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q4_k_q8_k_ref(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q4_k_q8_k: {} weight blocks, {} activation blocks", w.len(), a.len());
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let q = unpack(wb);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &wb.scales);
            let dot: i32 = (32 * j..32 * j + 32).map(|i| q[i] as i32 * ab.qs[i] as i32).sum();
            sumi += sc as i32 * dot;
            summ += m as i32 * (ab.bsums[2 * j] as i32 + ab.bsums[2 * j + 1] as i32);
        }
        sum += (ab.d * wb.d.to_f32()) * sumi as f32 - (ab.d * wb.dmin.to_f32()) * summ as f32;
    }
    sum
}

/// Quantizes `x` (`y.len() * 256` values) into `y`, as ggml's `quantize_row_q4_K_ref`:
/// 1. each sub-block of 32 gets a scale and min from `make_qkx2_quants` (levels 0..=15, weights
///    `rms(sub-block) + |x|`, minimising squared error over 21 candidate scales);
/// 2. the eight scales are quantized to 6 bits against `d = max_scale / 63`, the mins against
///    `dmin = max_min / 63`, and packed as [`get_scale_min_k4`] reads them;
/// 3. every weight is re-rounded against its sub-block's quantized scale and min.
///
/// # Panics
/// If `x.len() != y.len() * 256`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4K]) {
    quantize_row_impl(x, None, y)
}

/// [`quantize_row_ref`] with each value's weight `rms + |x|` multiplied by its `importance` (one per value).
///
/// # Panics
/// If `x.len() != y.len() * 256` or `importance.len() != x.len()`.
pub fn quantize_row_weighted(x: &[f32], importance: &[f32], y: &mut [BlockQ4K]) {
    assert_eq!(importance.len(), x.len(), "Q4_K quantize: one importance per value");
    quantize_row_impl(x, Some(importance), y)
}

fn quantize_row_impl(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ4K]) {
    assert_eq!(x.len(), y.len() * QK_K, "Q4_K quantize: {} values for {} blocks", x.len(), y.len());
    for (n, (xb, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0.0f32; QK_K / 32], [0.0f32; QK_K / 32]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for (j, (xs, ls)) in xb.chunks_exact(32).zip(l.chunks_exact_mut(32)).enumerate() {
            let sum_x2 = xs.iter().fold(0.0f32, |s, &v| s + v * v);
            let av_x = (sum_x2 / 32.0).sqrt();
            let weights: [f32; 32] = std::array::from_fn(|i| match importance {
                None => av_x + xs[i].abs(),
                Some(imp) => (av_x + xs[i].abs()) * imp[n * QK_K + 32 * j + i],
            });
            (scales[j], mins[j]) = make_qkx2_quants(15, xs, &weights, ls, -1.0, 0.1, 20, false);
            max_scale = max_scale.max(scales[j]);
            max_min = max_min.max(mins[j]);
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        yb.scales = [0; K_SCALE_SIZE];
        for j in 0..QK_K / 32 {
            // `as u8` before the clamp, as ggml stores the int into a uint8_t first (values are >= 0 here).
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                yb.scales[j] = ls;
                yb.scales[j + 4] = lm;
            } else {
                yb.scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                yb.scales[j - 4] |= (ls >> 4) << 6;
                yb.scales[j] |= (lm >> 4) << 6;
            }
        }
        yb.d = f16::from_f32(max_scale / 63.0);
        yb.dmin = f16::from_f32(max_min / 63.0);
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &yb.scales);
            let d = yb.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            let dm = yb.dmin.to_f32() * m as f32;
            for i in 32 * j..32 * j + 32 {
                l[i] = nearest_int((xb[i] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for c in 0..QK_K / 64 {
            for i in 0..32 {
                yb.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        // Eight distinct 6-bit scales and mins, packed as the quantizer packs them, read back by get_scale_min_k4.
        let sc: [u8; 8] = [0, 1, 17, 63, 32, 47, 5, 60];
        let m: [u8; 8] = [63, 62, 16, 15, 48, 3, 33, 0];
        let mut packed = [0u8; K_SCALE_SIZE];
        for j in 0..8 {
            if j < 4 {
                packed[j] = sc[j];
                packed[j + 4] = m[j];
            } else {
                packed[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
                packed[j - 4] |= (sc[j] >> 4) << 6;
                packed[j] |= (m[j] >> 4) << 6;
            }
        }
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn quantize_stores_levels_in_chunk_order() {
        // Sub-block j holds a ramp over [-(j+1)/2, (j+1)/2], so every sub-block needs its own scale and min and
        // every weight its own level; a misplaced nibble or scale would move values by far more than half a step.
        let x: Vec<f32> = (0..QK_K).map(|i| ((i % 32) as f32 / 31.0 - 0.5) * (i / 32 + 1) as f32).collect();
        let mut b = [BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] }];
        quantize_row_ref(&x, &mut b);
        let mut y = vec![0.0f32; QK_K];
        dequantize_row_ref(&b, &mut y);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            let step = (i / 32 + 1) as f32 / 15.0;
            assert!((a - b).abs() <= 0.6 * step, "weight {i}: {a} vs {b}");
        }
    }
}
