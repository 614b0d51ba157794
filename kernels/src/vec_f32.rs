//! f32 vector helpers for attention, dispatched to the level chosen by [`crate::dispatch`]. Any length works (the
//! SIMD loops finish with a scalar tail); results are deterministic for a given level.

use half::f16;

use crate::dispatch::kernels;

/// Asks the CPU to bring `data` into its L2 cache ahead of use (`prefetcht1`). A hint: it changes no result, and
/// does nothing where there is no such instruction. L2, not L1: data wanted some microseconds later would hold the
/// L1's few miss buffers all that time and stall the loads of the work in between.
pub fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let base = data.as_ptr().cast::<i8>();
        for off in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: `prefetcht1` is SSE, which every x86-64 CPU has, and cannot fault; the address lies inside
            // `data`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(base.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Σ `a[i]·b[i]`. Panics if the lengths differ.
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

/// Σ `a[i]·b[i]` with `b` in f16 (e.g. an f16 key cache). Panics if the lengths differ.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    (kernels().dot_f16)(a, b)
}

/// y += alpha·x with `x` in f16 (e.g. an f16 value cache). Panics if the lengths differ.
pub fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
    (kernels().axpy_f16)(alpha, x, y)
}

/// Attention scores of one or more query heads against one cache block whose keys are stored transposed:
/// `kt[d·lanes + j]` is dimension `d` of the block's position `j`, so a key dimension's values for all the block's
/// positions are contiguous and the scores come out as column sums, with no horizontal additions.
///
/// `out[h·lanes + j] = Σ_d q[h·hd + d] · kt[d·lanes + j]` for every head `h` in `q` (`hd = kt.len() / lanes`) and
/// every lane `j`. Heads that share a key head share each key load. `lanes` must be a multiple of 8.
///
/// Arithmetic, the same on every level (so SIMD equals [`dot_cols_ref`] bit for bit): per output, fused
/// multiply-adds in increasing `d` into two partial sums, one for even and one for odd `d`, then their sum.
pub fn dot_cols(q: &[f32], kt: &[f32], lanes: usize, out: &mut [f32]) {
    (kernels().dot_cols_f32)(q, kt, lanes, out)
}

/// [`dot_cols`] with keys in f16.
pub fn dot_cols_f16(q: &[f32], kt: &[f16], lanes: usize, out: &mut [f32]) {
    (kernels().dot_cols_f16)(q, kt, lanes, out)
}

/// Checks [`dot_cols`]' arguments; returns (head dimension, heads).
pub(crate) fn dot_cols_shape(q_len: usize, kt_len: usize, lanes: usize, out_len: usize) -> (usize, usize) {
    assert!(lanes > 0 && lanes.is_multiple_of(8), "dot_cols: {lanes} lanes, not a multiple of 8");
    assert!(kt_len.is_multiple_of(lanes) && kt_len > 0, "dot_cols: {kt_len} keys are not whole columns of {lanes}");
    let hd = kt_len / lanes;
    assert!(q_len.is_multiple_of(hd), "dot_cols: {q_len} query values are not whole heads of {hd}");
    let heads = q_len / hd;
    assert_eq!(out_len, heads * lanes, "dot_cols: output holds {out_len} values, expected heads·lanes");
    (hd, heads)
}

/// The scalar statement of [`dot_cols`]' arithmetic (keys as f32 or f16 through `get`).
pub fn dot_cols_ref<T: Copy>(q: &[f32], kt: &[T], lanes: usize, out: &mut [f32], get: impl Fn(T) -> f32) {
    let (hd, heads) = dot_cols_shape(q.len(), kt.len(), lanes, out.len());
    for h in 0..heads {
        for j in 0..lanes {
            let mut part = [0f32; 2];
            for d in 0..hd {
                part[d & 1] = q[h * hd + d].mul_add(get(kt[d * lanes + j]), part[d & 1]);
            }
            out[h * lanes + j] = part[0] + part[1];
        }
    }
}

/// Converts `src` (e.g. a block of an f16 KV cache) to f32 in `dst`. Every f16 is exactly an f32, so all levels
/// give the same values. Tiled prefill attention converts a block once and then uses it for every query row of the
/// tile, where the f16 kernels would convert it again for each few rows. Panics if the lengths differ.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    (kernels().f16_to_f32)(src, dst)
}

/// The scalar statement of [`f16_to_f32`].
pub fn f16_to_f32_ref(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: {} values into {}", src.len(), dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Values of an 8-bit KV cache (blocks of 32 with an f32 scale each) as f32 in `dst`: `dst[r·lanes + j] =
/// q[r·lanes + j] · d[(r / 32)·lanes + j]`. With `lanes` 1 that is a row of blocks (cached values: each 32 values
/// share a scale); with `lanes` the block size it is a transposed key tile, whose blocks run down each lane's
/// column 32 rows at a time. One multiply of two exact values per element, so all levels give the same bits.
/// Attention converts a block once like this and then runs the f32 kernels on it, in decode and in tiled prefill
/// alike, which keeps their arithmetic the same. Panics unless `q` and `dst` are whole blocks of 32 rows of
/// `lanes` and `d` has one scale per block.
pub fn dequant_q8(q: &[i8], d: &[f32], lanes: usize, dst: &mut [f32]) {
    (kernels().dequant_q8)(q, d, lanes, dst)
}

/// The scalar statement of [`dequant_q8`], element by element as its documentation says.
pub fn dequant_q8_ref(q: &[i8], d: &[f32], lanes: usize, dst: &mut [f32]) {
    assert!(lanes > 0 && q.len() == dst.len() && q.len().is_multiple_of(32 * lanes) && d.len() * 32 == q.len());
    for (i, (o, &q)) in dst.iter_mut().zip(q).enumerate() {
        let (r, j) = (i / lanes, i % lanes);
        *o = f32::from(q) * d[(r / 32) * lanes + j];
    }
}

/// The body of [`dequant_q8`] (the scalar level's too), inlined into each level's entry point so it is
/// vectorised for that level.
#[inline(always)]
pub(crate) fn dequant_q8_impl(q: &[i8], d: &[f32], lanes: usize, dst: &mut [f32]) {
    assert!(
        lanes > 0 && q.len() == dst.len() && q.len().is_multiple_of(32 * lanes) && d.len() * 32 == q.len(),
        "dequant_q8: {} values, {} scales and {} outputs are not blocks of 32 rows of {lanes}",
        q.len(),
        d.len(),
        dst.len()
    );
    if lanes == 1 {
        for ((o, q), &d) in dst.chunks_exact_mut(32).zip(q.chunks_exact(32)).zip(d) {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = f32::from(q) * d;
            }
        }
        return;
    }
    let block = 32 * lanes;
    for ((o, q), d) in dst.chunks_exact_mut(block).zip(q.chunks_exact(block)).zip(d.chunks_exact(lanes)) {
        for (o, q) in o.chunks_exact_mut(lanes).zip(q.chunks_exact(lanes)) {
            for ((o, &q), &d) in o.iter_mut().zip(q).zip(d) {
                *o = f32::from(q) * d;
            }
        }
    }
}

/// The weighted sums of a run of `n` cached values for one or more heads that share them: for each head `h`,
/// `out[h·width..][..width] += Σ_j w[h·w_stride + j] · v[j·v_stride..][..width]`, `j` in `0..n`. Each value row is
/// loaded once for all heads. Per element, fused multiply-adds in row order, as one [`axpy`] per row would do.
pub fn axpy_rows(n: usize, w: &[f32], w_stride: usize, v: &[f32], v_stride: usize, out: &mut [f32], width: usize) {
    (kernels().axpy_rows_f32)(AxpyRows { n, w, w_stride, v_stride, width }, v, out)
}

/// [`axpy_rows`] with values in f16.
pub fn axpy_rows_f16(n: usize, w: &[f32], w_stride: usize, v: &[f16], v_stride: usize, out: &mut [f32], width: usize) {
    (kernels().axpy_rows_f16)(AxpyRows { n, w, w_stride, v_stride, width }, v, out)
}

/// The shape of an [`axpy_rows`] call: rows, weights and their per-head stride, the value rows' stride and the
/// output width per head.
#[derive(Clone, Copy, Debug)]
pub struct AxpyRows<'a> {
    pub n: usize,
    pub w: &'a [f32],
    pub w_stride: usize,
    pub v_stride: usize,
    pub width: usize,
}

impl AxpyRows<'_> {
    /// Checks the lengths against `v` and `out`; returns the number of heads.
    pub(crate) fn heads(&self, v_len: usize, out_len: usize) -> usize {
        assert!(self.width > 0 && out_len.is_multiple_of(self.width), "axpy_rows: output is not whole heads");
        let heads = out_len / self.width;
        if self.n > 0 && heads > 0 {
            assert!(self.w.len() >= (heads - 1) * self.w_stride + self.n, "axpy_rows: weights out of range");
            assert!(self.w_stride >= self.n || heads == 1, "axpy_rows: heads' weights overlap");
            assert!(v_len >= (self.n - 1) * self.v_stride + self.width, "axpy_rows: value rows out of range");
        }
        heads
    }
}

/// The scalar statement of [`axpy_rows`]' arithmetic.
pub fn axpy_rows_ref<T: Copy>(a: AxpyRows<'_>, v: &[T], out: &mut [f32], get: impl Fn(T) -> f32) {
    let heads = a.heads(v.len(), out.len());
    for h in 0..heads {
        for j in 0..a.n {
            let wj = a.w[h * a.w_stride + j];
            for (i, o) in out[h * a.width..(h + 1) * a.width].iter_mut().enumerate() {
                *o = wj.mul_add(get(v[j * a.v_stride + i]), *o);
            }
        }
    }
}

/// The running state of a streaming softmax: the largest score so far and the sum of `e^(score − max)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxState {
    pub max: f32,
    pub sum: f32,
}

impl SoftmaxState {
    pub const EMPTY: SoftmaxState = SoftmaxState { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Folds in the state of a later, separately computed run of scores: raises the maximum to cover both and
    /// returns the factors `(e^(old max − max), e^(other max − max))` by which the two runs' weighted sums must be
    /// scaled before they are added. The larger maximum's factor is exactly 1; the sums combine as
    /// `sum·r_self + other.sum·r_other`.
    pub fn merge(&mut self, other: SoftmaxState) -> (f32, f32) {
        let max = self.max.max(other.max);
        let (r_self, r_other) = (exp_approx(self.max - max), exp_approx(other.max - max));
        self.sum = self.sum * r_self + other.sum * r_other;
        self.max = max;
        (r_self, r_other)
    }
}

/// One block of a streaming (online) softmax over attention scores: multiplies `x` by `scale`, raises the running
/// maximum to cover them, turns `x` into the weights `e^(x − max)` and adds their sum (after rescaling the old sum
/// to the new maximum). Returns the factor `e^(old max − new max)` by which sums weighted under the old maximum must
/// be rescaled: exactly 1 when the maximum did not grow.
///
/// The weights' sum is taken as 8 interleaved partial sums (value `i` into sum `i mod 8`, in order), combined
/// pairwise; every level does the same arithmetic, so results agree bit for bit.
pub fn softmax_block(x: &mut [f32], scale: f32, state: &mut SoftmaxState) -> f32 {
    (kernels().softmax_block)(x, scale, state)
}

/// The body of [`softmax_block`], inlined into each level's entry point: fixed 8-wide arrays the compiler keeps in
/// one or two vector registers. On Zen 1, which issues about one 256-bit operation a cycle, the operations per value
/// are what count: blocks of 128 scores on one thread (AVX2) took 2.27 ns a value with the exponential in separate
/// multiplies and adds, 1.84 in fused ones ([`exp_reduced`]), 1.66 with [`exp_nonpositive`]'s single range test,
/// and 1.56 with [`greater`] for `f32::max` (a throwaway timing loop, best of 30). In SmolLM2 Q4_1 pp512 after 4,096
/// cached positions this function went from 9.0% of the samples to 6.1% (perf, 2 threads).
#[inline(always)]
pub(crate) fn softmax_block_impl(x: &mut [f32], scale: f32, state: &mut SoftmaxState) -> f32 {
    let mut mx = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for k in 0..8 {
            c[k] *= scale;
            mx[k] = greater(c[k], mx[k]);
        }
    }
    for (k, v) in chunks.into_remainder().iter_mut().enumerate() {
        *v *= scale;
        mx[k] = greater(*v, mx[k]);
    }
    let block_max = mx.iter().fold(f32::NEG_INFINITY, |a, &b| greater(b, a));
    let rescale = if block_max > state.max {
        let r = exp_approx(state.max - block_max);
        state.max = block_max;
        state.sum *= r;
        r
    } else {
        1.0
    };
    let m = state.max;
    // The exponentials in a plain loop (which the compiler vectorises), then the sums.
    for v in x.iter_mut() {
        *v = exp_nonpositive(*v - m);
    }
    let mut part = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            part[k] += c[k];
        }
    }
    for (k, v) in chunks.remainder().iter().enumerate() {
        part[k] += *v;
    }
    state.sum += ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    rescale
}

/// `gate[i] = silu(gate[i]) · up[i]` (SwiGLU). Panics if the lengths differ.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    (kernels().swiglu)(gate, up)
}

/// `gate[i] = gelu_tanh(gate[i]) · up[i]` (GeGLU with the tanh approximation). Panics if the lengths differ.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    (kernels().geglu)(gate, up)
}

/// `v` if it is greater than the running maximum `m`, else `m`: a NaN score is passed over, as `f32::max` would
/// pass it over, but in one `maxps` where `max` adds a test for NaN and a blend to the chain of every block.
#[inline(always)]
fn greater(v: f32, m: f32) -> f32 {
    if v > m { v } else { m }
}

/// e^x for the activations, in plain arithmetic the compiler vectorises (libm's `expf` is a call per value, and
/// was 4% of a batched decode step). `x = n·ln2 + r` with `|r| ≤ ln2/2`, `e^r` by its Taylor series to `r⁶`
/// (truncation error below 1.2e-7 relative, about one ulp), and `2ⁿ` built in the exponent bits. Outside
/// [-87, 88], where `2ⁿ` would leave the normal range, the result is 0 or +∞, as the activations need (a huge
/// negative gate gives exactly 0). NaN stays NaN.
#[inline(always)]
fn exp_approx(x0: f32) -> f32 {
    let v = exp_reduced(x0.clamp(-87.0, 88.0));
    if x0 > 88.0 {
        f32::INFINITY
    } else if x0 < -87.0 {
        0.0
    } else {
        v
    }
}

/// [`exp_approx`] for `x0 ≤ 0` (or NaN), the same bits with one range test fewer: the softmax's scores less their
/// running maximum, where each test and select is a vector operation per eight values of a block.
#[inline(always)]
fn exp_nonpositive(x0: f32) -> f32 {
    let low = x0 < -87.0;
    let v = exp_reduced(if low { -87.0 } else { x0 });
    if low { 0.0 } else { v }
}

/// The arithmetic of [`exp_approx`] for `x` in [-87, 88] (or NaN), in fused multiply-adds: the same instruction on
/// every level (the scalar one calls libm's `fmaf`, exactly rounded as well), so the levels still agree bit for bit.
/// A separate multiply and add per step, as the compiler leaves `a·b + c` (it may not fuse them on its own, which
/// would change the bits), was about twice the vector operations (see [`softmax_block_impl`]); SwiGLU over 1,536
/// values went from 3.5 to 2.9 µs. The scalar level pays a call per `fmaf`, as its attention already does
/// ([`dot_cols_ref`]): its SmolLM2 decode went from about 21 to 19 t/s.
#[inline(always)]
fn exp_reduced(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so that r keeps the bits a single constant's rounding would lose.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23: adding and subtracting it rounds to an integer
    let y = x.mul_add(LOG2E, MAGIC);
    let n = y - MAGIC;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    // `y`'s low mantissa bits hold n (MAGIC's own low 9 bits are zero), so shifting `bits(y) + 127` left by 23
    // leaves exactly the exponent field of 2ⁿ: no float-to-int conversion, nothing for the compiler to check.
    p * f32::from_bits(y.to_bits().wrapping_add(127) << 23)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The softmax's exponential must give the bits of the general one wherever the softmax calls it (differences
    /// from a running maximum: at most 0, or NaN), including both sides of the cutoff at -87.
    #[test]
    fn exp_nonpositive_matches_exp_approx() {
        let mut xs = vec![0.0, -0.0, -1e-30, -1e-7, -0.5, -1.0, -10.0, -86.999, -87.0, -87.001, -88.0, -1e30];
        xs.extend([f32::NEG_INFINITY, f32::MIN, -f32::MIN_POSITIVE, -f32::from_bits(1)]);
        // Every 1,021st bit pattern of the negative floats, down to -inf.
        xs.extend((0x8000_0000u32..=0xFF80_0000).step_by(1021).map(f32::from_bits));
        for &x in &xs {
            assert_eq!(exp_nonpositive(x).to_bits(), exp_approx(x).to_bits(), "e^{x}");
        }
        assert!(exp_nonpositive(f32::NAN).is_nan() && exp_approx(f32::NAN).is_nan());
        // And the range tests still hold at the top, which only the general one sees.
        assert_eq!(exp_approx(88.5), f32::INFINITY);
        assert_eq!(exp_approx(0.0), 1.0);
    }
}
