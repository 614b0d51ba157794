//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, `q` in 0..=15, with a
//! 6-bit scale `sc` and 6-bit min `m` per sub-block. 4.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_K` (GGUF type 12). The eight 6-bit scales and eight 6-bit mins are packed
//! into 12 bytes (`scales`): for sub-block `j < 4`, `sc = scales[j] & 63`, `m = scales[j + 4] & 63`; for `j >= 4`,
//! `sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4)` and `m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)`.
//! `qs` holds 64-weight chunks of 32 bytes: byte `l` of chunk `c` has weight `64c + l` (low nibble) and
//! `64c + 32 + l` (high nibble). Dotted against Q8_K activations.

use half::f16;

use super::k_quants::{K_SCALE_SIZE, QK_K};

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

use super::k_quants::get_scale_min_k4;
use super::q8_k::BlockQ8K;

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
