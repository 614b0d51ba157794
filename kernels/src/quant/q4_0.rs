//! Q4_0: blocks of 32 weights with one f16 scale; `x = d * (q - 8)`, `q` in 0..=15. 4.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_0` (GGUF type 2). Byte `j` of `qs` holds weight `j` in its low nibble and
//! weight `j + 16` in its high nibble. Dotted against Q8_0 activations.

use half::f16;

use super::q8_0::{BlockQ8_0, QK8_0};

/// Weights per block.
pub const QK4_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// Quantizes `x` (`y.len() * 32` values) into `y`, as ggml's `quantize_row_q4_0_ref`: take the value `max` of
/// largest magnitude (its sign kept), `d = max / -8`, so `max` itself maps to `q = 0`, and
/// `q = min(15, trunc(x / d + 8.5))`. Using the signed extreme gains one level on that side: the range is -8..=7.
///
/// # Panics
/// If `x.len() != y.len() * 32`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), y.len() * QK4_0, "Q4_0 quantize: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        // x * id + 8.5 lies in [0.5, 16.5]; `as u8` truncates like ggml's (int8_t) cast there.
        let q = |v: f32| ((v * id + 8.5) as u8).min(15);
        for j in 0..QK4_0 / 2 {
            yb.qs[j] = q(xb[j]) | (q(xb[j + QK4_0 / 2]) << 4);
        }
    }
}

/// Quantizes `x` (`y.len() * 32` values) into `y`, choosing each block's scale by search rather than from its
/// largest value (see [`super::search`]): the scale that minimises the squared error weighted by `importance` (one
/// per value, 1 if `None`). Same format, so readable by anything
/// that reads Q4_0; not llama.cpp's bytes (that is [`quantize_row_ref`]).
///
/// # Panics
/// If `x.len() != y.len() * 32`, or `x` is not whole rows of `importance.len()` values.
pub fn quantize_row_search(x: &[f32], importance: Option<&[f32]>, y: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), y.len() * QK4_0, "Q4_0 quantize: {} values for {} blocks", x.len(), y.len());
    super::search_sym::with_symmetric_blocks(x, importance, -8, 7, |blocks| {
        for (b, s) in blocks.iter().enumerate() {
            y[b].d = s.d;
            let q = |j: usize| (s.q[j] + 8) as u8;
            for j in 0..QK4_0 / 2 {
                y[b].qs[j] = q(j) | (q(j + QK4_0 / 2) << 4);
            }
        }
    });
}

/// Dequantizes `x` into `y` (`x.len() * 32` values): `y = d * (q - 8)`.
///
/// # Panics
/// If `y.len() != x.len() * 32`.
pub fn dequantize_row_ref(x: &[BlockQ4_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_0, "Q4_0 dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = xb.d.to_f32();
        for (j, &b) in xb.qs.iter().enumerate() {
            yb[j] = ((b & 0xF) as i32 - 8) as f32 * d;
            yb[j + QK4_0 / 2] = ((b >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Dot product of Q4_0 weights with Q8_0 activations: per block, the exact integer sum `Σ (qw - 8) * qa` times
/// `dw * da`, accumulated in f32 block by block.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q4_0_q8_0_ref(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q4_0_q8_0: {} weight blocks, {} activation blocks", w.len(), a.len());
    const _: () = assert!(QK4_0 == QK8_0);
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for (j, &b) in wb.qs.iter().enumerate() {
            sumi += ((b & 0xF) as i32 - 8) * ab.qs[j] as i32;
            sumi += ((b >> 4) as i32 - 8) * ab.qs[j + QK4_0 / 2] as i32;
        }
        sum += sumi as f32 * (wb.d.to_f32() * ab.d.to_f32());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        // x = j - 16: the largest magnitude is x0 = -16, so d = -16 / -8 = 2 and x0 maps to level 0;
        // x = 15 would be level 16, clamped to 15 (the range is asymmetric: -8..=7 times d).
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let mut b = [BlockQ4_0::default()];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].d.to_f32(), 2.0);
        // Byte 0: weight 0 (level 0) low, weight 16 (x = 0, level 8) high.
        assert_eq!(b[0].qs[0], 0x80);
        // Byte 15: weight 15 (x = -1, trunc(-0.5 + 8.5) = 8) low, weight 31 (x = 15, clamped 15) high.
        assert_eq!(b[0].qs[15], 0xF8);
        let mut y = [0.0f32; 32];
        dequantize_row_ref(&b, &mut y);
        assert_eq!((y[0], y[16], y[15], y[31]), (-16.0, 0.0, 0.0, 14.0));
    }
}
