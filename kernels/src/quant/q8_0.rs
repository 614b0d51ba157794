//! Q8_0: blocks of 32 weights with one f16 scale; `x = d * q`, `q` in -127..=127. 8.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q8_0` (GGUF type 8). Also the activation side of the 32-wide integer dot
//! products (Q4_0, Q4_1, Q5_0, Q8_0 weights).

use half::f16;

/// Weights per block.
pub const QK8_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Signed 8-bit quants.
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Quantizes `x` (`y.len() * 32` values) into `y`, as ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, then each
/// value is `x / d` rounded half away from zero (C `roundf`). The inverse scale is taken from the f32 `d`, not from
/// its f16 rounding, exactly as ggml does, so the bytes match llama.cpp's.
///
/// # Panics
/// If `x.len() != y.len() * 32`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "Q8_0 quantize: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            // |v * id| <= 127 (up to rounding of id), and `as` saturates anyway.
            *q = (v * id).round() as i8;
        }
    }
}

/// Dequantizes `x` into `y` (`x.len() * 32` values): `y = d * q`.
///
/// # Panics
/// If `y.len() != x.len() * 32`.
pub fn dequantize_row_ref(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK8_0, "Q8_0 dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = xb.d.to_f32();
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = d * q as f32;
        }
    }
}

/// Dot product of Q8_0 weights with Q8_0 activations: per block, the exact integer sum `Σ qw * qa` times
/// `dw * da`, accumulated in f32 block by block. This is the specification the SIMD variants are tested against.
///
/// # Panics
/// If the slices differ in length.
pub fn vec_dot_q8_0_q8_0_ref(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot_q8_0_q8_0: {} weight blocks, {} activation blocks", w.len(), a.len());
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        let sumi: i32 = wb.qs.iter().zip(&ab.qs).map(|(&qw, &qa)| qw as i32 * qa as i32).sum();
        sum += sumi as f32 * (wb.d.to_f32() * ab.d.to_f32());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        // amax = 127 gives d = 1; 2.5 rounds away from zero to 3 (C roundf), -0.5 to -1.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        x[3] = -127.0;
        let mut b = [BlockQ8_0::default()];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].d.to_f32(), 1.0);
        assert_eq!(&b[0].qs[..5], &[127, 3, -1, -127, 0]);
        assert_eq!(vec_dot_q8_0_q8_0_ref(&b, &b), (127 * 127 * 2 + 9 + 1) as f32);
    }
}
