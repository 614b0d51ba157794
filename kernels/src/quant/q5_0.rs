//! Q5_0: blocks of 32 weights with one f16 scale; `x = d * (q - 16)`, `q` in 0..=31. 5.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q5_0` (GGUF type 6). The low four bits of each quant are stored as in Q4_0
//! (byte `j`: weight `j` low, weight `j + 16` high); the fifth bit of weight `i` is bit `i` of the little-endian
//! u32 `qh`.

use half::f16;

use super::q8_0::{BlockQ8_0, QK8_0};

/// Weights per block.
pub const QK5_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, little-endian u32: bit `i` belongs to weight `i`.
    pub qh: [u8; 4],
    /// Low nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// Quantizes `x` (`y.len() * 32` values) into `y`, as ggml's `quantize_row_q5_0_ref`: the value `max` of largest
/// magnitude (sign kept) gives `d = max / -16`, and `q = min(31, trunc(x / d + 16.5))`, range -16..=15.
///
/// # Panics
/// If `x.len() != y.len() * 32`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK5_0, "Q5_0 quantize: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        // x * id + 16.5 lies in [0.5, 32.5]; `as u8` truncates like ggml's (int8_t) cast there.
        let q = |v: f32| ((v * id + 16.5) as u8).min(31);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let (q0, q1) = (q(xb[j]), q(xb[j + QK5_0 / 2]));
            yb.qs[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
            qh |= ((q0 >> 4) as u32) << j;
            qh |= ((q1 >> 4) as u32) << (j + QK5_0 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// Quantizes `x` (`y.len() * 32` values) into `y`, choosing each block's scale by search (see
/// [`super::search`] and `q4_0::quantize_row_search`): the weighted-least-squares scale over levels -16..=15.
///
/// # Panics
/// If `x.len() != y.len() * 32`, or `x` is not whole rows of `importance.len()` values.
pub fn quantize_row_search(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK5_0, "Q5_0 quantize: {} values for {} blocks", x.len(), y.len());
    super::search_sym::with_symmetric_blocks(x, importance, -16, 15, |blocks| {
        for (b, s) in blocks.iter().enumerate() {
            y[b].d = s.d;
            let mut qh = 0u32;
            for j in 0..QK5_0 / 2 {
                let (q0, q1) = ((s.q[j] + 16) as u8, (s.q[j + QK5_0 / 2] + 16) as u8);
                y[b].qs[j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
                qh |= ((q0 >> 4) as u32) << j;
                qh |= ((q1 >> 4) as u32) << (j + QK5_0 / 2);
            }
            y[b].qh = qh.to_le_bytes();
        }
    });
}

/// The 32 quants of a block, each in 0..=31 (before subtracting 16).
fn unpack(b: &BlockQ5_0) -> [u8; QK5_0] {
    let qh = u32::from_le_bytes(b.qh);
    let mut q = [0u8; QK5_0];
    for j in 0..QK5_0 / 2 {
        q[j] = (b.qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK5_0 / 2] = (b.qs[j] >> 4) | ((((qh >> (j + QK5_0 / 2)) & 1) as u8) << 4);
    }
    q
}

/// Dequantizes `x` into `y` (`x.len() * 32` values): `y = d * (q - 16)`.
///
/// # Panics
/// If `y.len() != x.len() * 32`.
pub fn dequantize_row_ref(x: &[BlockQ5_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK5_0, "Q5_0 dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = xb.d.to_f32();
        for (out, q) in yb.iter_mut().zip(unpack(xb)) {
            *out = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Dot product of Q5_0 weights with Q8_0 activations: per block, the exact integer sum `Σ (qw - 16) * qa` times
/// `dw * da`, accumulated in f32 block by block.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q5_0_q8_0_ref(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q5_0_q8_0: {} weight blocks, {} activation blocks", w.len(), a.len());
    const _: () = assert!(QK5_0 == QK8_0);
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let sumi: i32 = unpack(wb).iter().zip(&ab.qs).map(|(&qw, &qa)| (qw as i32 - 16) * qa as i32).sum();
        sum += sumi as f32 * (wb.d.to_f32() * ab.d.to_f32());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        // x = j - 16, largest magnitude x0 = -16: d = 1, level = x + 16, so level j for weight j (31 -> 31).
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let mut b = [BlockQ5_0::default()];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].d.to_f32(), 1.0);
        // Weights 16..32 have level >= 16, so exactly bits 16..32 of qh are set.
        assert_eq!(u32::from_le_bytes(b[0].qh), 0xFFFF_0000);
        assert_eq!(b[0].qs[1], 0x01 | (17 & 0xF) << 4);
        let mut y = [0.0f32; 32];
        dequantize_row_ref(&b, &mut y);
        assert_eq!(y.to_vec(), x);
    }
}
