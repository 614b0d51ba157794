//! f32 vector helpers for attention, dispatched to the level chosen by [`crate::dispatch`]. Any length works (the
//! SIMD loops finish with a scalar tail); results are deterministic for a given level.

use half::f16;

use crate::dispatch::kernels;

/// Σ a[i]·b[i]. Panics if the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    (kernels().dot_f32)(a, b)
}

/// y += alpha·x. Panics if the lengths differ.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    (kernels().axpy_f32)(alpha, x, y)
}

/// y *= alpha.
pub fn scale(alpha: f32, y: &mut [f32]) {
    (kernels().scale_f32)(alpha, y)
}

/// Σ a[i]·b[i] with `b` in f16 (e.g. an f16 key cache). Panics if the lengths differ.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    (kernels().dot_f16)(a, b)
}

/// y += alpha·x with `x` in f16 (e.g. an f16 value cache). Panics if the lengths differ.
pub fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
    (kernels().axpy_f16)(alpha, x, y)
}
