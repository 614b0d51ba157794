//! BF16: the top 16 bits of an IEEE 754 f32 (8-bit exponent, 7-bit mantissa), one value per element, 16 bits per
//! weight (GGUF type 30, ggml's `ggml_bf16_t`). Widening is exact (shift left by 16); narrowing rounds to nearest,
//! ties to even, and keeps NaNs NaN, as ggml's `ggml_compute_fp32_to_bf16` does.

use half::bf16;

/// Converts `x` to bf16, rounding to nearest even.
///
/// # Panics
/// If the slices differ in length.
pub fn quantize_row_ref(x: &[f32], y: &mut [bf16]) {
    assert_eq!(x.len(), y.len(), "BF16 quantize: {} values into {} slots", x.len(), y.len());
    for (out, &v) in y.iter_mut().zip(x) {
        *out = bf16::from_f32(v);
    }
}

/// Widens `x` to f32 (exact).
///
/// # Panics
/// If the slices differ in length.
pub fn dequantize_row_ref(x: &[bf16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "BF16 dequantize: {} values into {} slots", x.len(), y.len());
    for (out, &v) in y.iter_mut().zip(x) {
        *out = v.to_f32();
    }
}
