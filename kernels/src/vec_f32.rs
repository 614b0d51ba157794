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

/// Attention scores over a run of cached keys: `out[j] = q · k[j·stride..][..q.len()]` for each `j` in
/// `0..out.len()` (key rows `stride` apart, e.g. one head's slice of each cached position). One call per run,
/// not one per key.
pub fn dot_rows(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    (kernels().dot_rows_f32)(q, k, stride, out)
}

/// [`dot_rows`] with keys in f16.
pub fn dot_rows_f16(q: &[f32], k: &[f16], stride: usize, out: &mut [f32]) {
    (kernels().dot_rows_f16)(q, k, stride, out)
}

/// The weighted sum of a run of cached values: `out += Σ_j w[j] · v[j·stride..][..out.len()]`.
pub fn axpy_rows(w: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    (kernels().axpy_rows_f32)(w, v, stride, out)
}

/// [`axpy_rows`] with values in f16.
pub fn axpy_rows_f16(w: &[f32], v: &[f16], stride: usize, out: &mut [f32]) {
    (kernels().axpy_rows_f16)(w, v, stride, out)
}

/// Softmax weights in place: `x[i] = e^(x[i] − m)`, returning their sum (summed in index order).
pub fn exp_shift_sum(x: &mut [f32], m: f32) -> f32 {
    (kernels().exp_shift_sum)(x, m)
}

/// The body of [`exp_shift_sum`]: the exponentials in one vectorisable pass, then the sum.
#[inline(always)]
pub(crate) fn exp_shift_sum_impl(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp_approx(*v - m);
    }
    x.iter().sum()
}

/// `gate[i] = silu(gate[i]) · up[i]` (SwiGLU). Panics if the lengths differ.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    (kernels().swiglu)(gate, up)
}

/// `gate[i] = gelu_tanh(gate[i]) · up[i]` (GeGLU with the tanh approximation). Panics if the lengths differ.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    (kernels().geglu)(gate, up)
}

/// e^x for the activations, in plain arithmetic the compiler vectorises (libm's `expf` is a call per value, and
/// was 4% of a batched decode step). `x = n·ln2 + r` with `|r| ≤ ln2/2`, `e^r` by its Taylor series to `r⁶`
/// (truncation error below 1.2e-7 relative, about one ulp), and `2ⁿ` built in the exponent bits. Outside
/// [-87, 88], where `2ⁿ` would leave the normal range, the result is 0 or +∞, as the activations need (a huge
/// negative gate gives exactly 0). NaN stays NaN.
#[inline(always)]
fn exp_approx(x0: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so n·LN2_HI is exact for |n| < 2^11.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23: adding and subtracting it rounds to an integer
    let x = x0.clamp(-87.0, 88.0);
    let y = x * LOG2E + MAGIC;
    let n = y - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `y`'s low mantissa bits hold n (MAGIC's own low 9 bits are zero), so shifting `bits(y) + 127` left by 23
    // leaves exactly the exponent field of 2ⁿ: no float-to-int conversion, nothing for the compiler to check.
    let v = p * f32::from_bits(y.to_bits().wrapping_add(127) << 23);
    if x0 > 88.0 {
        f32::INFINITY
    } else if x0 < -87.0 {
        0.0
    } else {
        v
    }
}

/// The body of [`swiglu`], inlined into each level's entry point so it is vectorised for that level.
#[inline(always)]
pub(crate) fn swiglu_impl(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    for (g, &u) in gate.iter_mut().zip(up) {
        // Divide first: a huge negative gate then gives 0·u, not (−∞)/∞.
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

/// The body of [`geglu`]: `0.5·x·(1 + tanh z) = x / (1 + e^(-2z))` with `z = √(2/π)·(x + 0.044715·x³)`.
#[inline(always)]
pub(crate) fn geglu_impl(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up differ in length");
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z2 = TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
        *g = x / (1.0 + exp_approx(-z2)) * u;
    }
}
