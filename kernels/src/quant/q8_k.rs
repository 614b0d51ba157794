//! Q8_K: super-blocks of 256 values with an f32 scale; `x = d * q`, plus the sum of each group of 16 quants.
//! 9.125 bits per value.
//!
//! Byte-identical to ggml's `block_q8_K` (GGUF type 15). Used only as the activation side of the K-quant dot
//! products: `bsums` lets the min terms of Q2_K/Q4_K be applied once per sub-block instead of once per weight.

use super::k_quants::{QK_K, nearest_int};

/// One super-block of 256 activations.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Signed 8-bit quants.
    pub qs: [i8; QK_K],
    /// Sum of each consecutive group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// Quantizes `x` (`y.len() * 256` values) into `y`, as ggml's `quantize_row_q8_K_ref`: the value `max` of largest
/// magnitude (sign kept) gives the inverse scale `-127 / max`, `q = min(127, nearest_int(x * iscale))` (ties to
/// even), `d = 1 / iscale`, and `bsums` the sums of each 16 quants. (ggml keeps the range symmetric, -127..=127, so
/// its SIMD code can use sign tricks; we do the same so activations quantize identically.) An all-zero super-block
/// gets `d = 0` and zero quants.
///
/// # Panics
/// If `x.len() != y.len() * 256`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K, "Q8_K quantize: {} values for {} blocks", x.len(), y.len());
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, qs) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

/// Dequantizes `x` into `y` (`x.len() * 256` values): `y = d * q`.
///
/// # Panics
/// If `y.len() != x.len() * 256`.
pub fn dequantize_row_ref(x: &[BlockQ8K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "Q8_K dequantize: {} values for {} blocks", y.len(), x.len());
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = xb.d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_block() {
        // max = -2 (largest magnitude, negative): iscale = -127 / -2 = 63.5, d = 1 / 63.5. Then 1/127 * 63.5 = 0.5
        // rounds to even 0, 3/127 * 63.5 = 1.5 rounds to even 2, and 1.0 * 63.5 to even 64.
        let mut x = [0.0f32; QK_K];
        x[0] = -2.0;
        x[1] = 1.0 / 127.0;
        x[2] = 3.0 / 127.0;
        x[17] = 1.0;
        let mut b = [BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] }];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].d, 1.0 / 63.5);
        assert_eq!(&b[0].qs[..3], &[-127, 0, 2]);
        assert_eq!(b[0].qs[17], 64);
        assert_eq!(&b[0].bsums[..3], &[-125, 64, 0]);
    }
}
