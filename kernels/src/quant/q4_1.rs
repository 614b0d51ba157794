//! Q4_1: blocks of 32 weights with an f16 scale and an f16 minimum; `x = d * q + m`, `q` in 0..=15.
//! 5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_1` (GGUF type 3). Nibble order as Q4_0: byte `j` holds weight `j` (low) and
//! weight `j + 16` (high). Dotted against 8-bit activations whose block sums are known, so the `m` term costs one
//! multiply per block.

use half::f16;

use super::q8_0::{BlockQ8_0, QK8_0};

/// Weights per block.
pub const QK4_1: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (the value of q = 0).
    pub m: f16,
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// Quantizes `x` (`y.len() * 32` values) into `y`, as ggml's `quantize_row_q4_1_ref`: `m = min`,
/// `d = (max - min) / 15`, `q = min(15, trunc((x - min) / d + 0.5))`. The inverse scale comes from the f32 `d`.
///
/// # Panics
/// If `x.len() != y.len() * 32`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK4_1, "Q4_1 quantize: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        // (x - min) * id + 0.5 lies in [0.5, 15.5]; `as u8` truncates like ggml's (int8_t) cast there.
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..QK4_1 / 2 {
            yb.qs[j] = q(xb[j]) | (q(xb[j + QK4_1 / 2]) << 4);
        }
    }
}

/// Quantizes `x` (`y.len() * 32` values) into `y`, choosing each block's scale and minimum by search (see
/// [`super::search`]): candidate levels from a range of scales around the min/max fit, each with its
/// weighted-least-squares `(d, m)`, the least weighted error kept. Data that already lies on a Q4_1 grid (a
/// dequantized Q4_1 model) gets that grid back.
///
/// # Panics
/// If `x.len() != y.len() * 32`, or `importance` is not as long as `x`.
pub fn quantize_row_search(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK4_1, "Q4_1 quantize: {} values for {} blocks", x.len(), y.len());
    super::search::for_blocks(x, importance, |b, xb, w| {
        let a = super::search::affine(xb, w, 15);
        y[b].d = a.d;
        y[b].m = a.m;
        for j in 0..QK4_1 / 2 {
            y[b].qs[j] = a.q[j] | (a.q[j + QK4_1 / 2] << 4);
        }
    });
}

/// Dequantizes `x` into `y` (`x.len() * 32` values): `y = d * q + m`.
///
/// # Panics
/// If `y.len() != x.len() * 32`.
pub fn dequantize_row_ref(x: &[BlockQ4_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_1, "Q4_1 dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let (d, m) = (xb.d.to_f32(), xb.m.to_f32());
        for (j, &b) in xb.qs.iter().enumerate() {
            yb[j] = (b & 0xF) as f32 * d + m;
            yb[j + QK4_1 / 2] = (b >> 4) as f32 * d + m;
        }
    }
}

/// Dot product of Q4_1 weights with Q8_0 activations. Per block,
/// `Σ (dw*qw + m) * (da*qa) = (dw*da) * Σ qw*qa + (m*da) * Σ qa`: two exact integer sums (the second is the sum of
/// the activation quants, which a SIMD kernel may precompute), each times its float scale, accumulated in f32 block
/// by block.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q4_1_q8_0_ref(w: &[BlockQ4_1], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q4_1_q8_0: {} weight blocks, {} activation blocks", w.len(), a.len());
    const _: () = assert!(QK4_1 == QK8_0);
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for (j, &b) in wb.qs.iter().enumerate() {
            sumi += (b & 0xF) as i32 * ab.qs[j] as i32;
            sumi += (b >> 4) as i32 * ab.qs[j + QK4_1 / 2] as i32;
        }
        let suma: i32 = ab.qs.iter().map(|&q| q as i32).sum();
        let da = ab.d.to_f32();
        sum += (wb.d.to_f32() * da) * sumi as f32 + (wb.m.to_f32() * da) * suma as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        // x = j / 2 - 1 spans [-1, 14.5]: m = -1, d = 15.5 / 15, and every x lands near level j / 2.
        let x: Vec<f32> = (0..32).map(|j| j as f32 / 2.0 - 1.0).collect();
        let mut b = [BlockQ4_1::default()];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].m.to_f32(), -1.0);
        assert_eq!(b[0].qs[0] & 0xF, 0);
        assert_eq!(b[0].qs[15] >> 4, 15, "weight 31 is the maximum, level 15, in the high nibble of byte 15");
        let mut y = [0.0f32; 32];
        dequantize_row_ref(&b, &mut y);
        assert_eq!(y[0], -1.0);
        assert!((y[31] - 14.5).abs() < 0.01, "{}", y[31]);
        // The dot with all-ones activations (d = 1) is Σ dequantized values: checks the `m * Σ qa` term.
        let a = [BlockQ8_0 { d: f16::ONE, qs: [1; 32] }];
        let want: f32 = y.iter().sum();
        assert!((vec_dot_q4_1_q8_0_ref(&b, &a) - want).abs() < 1e-3);
    }
}
