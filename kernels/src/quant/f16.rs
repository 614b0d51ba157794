//! F16: IEEE 754 half precision, one value per element, 16 bits per weight (GGUF type 1, ggml's `ggml_fp16_t`).
//! Conversions round to nearest, ties to even, as ggml's (F16C `vcvtps2ph` with rounding mode 0, or its software
//! fallback) do.

use half::f16;

/// Converts `x` to f16, rounding to nearest even; values beyond ±65504 become ±infinity.
///
/// # Panics
/// If the slices differ in length.
pub fn quantize_row_ref(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "F16 quantize: {} values into {} slots", x.len(), y.len());
    for (out, &v) in y.iter_mut().zip(x) {
        *out = f16::from_f32(v);
    }
}

/// Widens `x` to f32 (exact).
///
/// # Panics
/// If the slices differ in length.
pub fn dequantize_row_ref(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "F16 dequantize: {} values into {} slots", x.len(), y.len());
    for (out, &v) in y.iter_mut().zip(x) {
        *out = v.to_f32();
    }
}
