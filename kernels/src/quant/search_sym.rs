//! The symmetric search ([`super::search`]) across blocks: each SIMD lane holds one block, so that every step of
//! the search is a vertical operation (no horizontal sums, no branches), 8 blocks at a time with AVX2 and 16 with
//! AVX-512. A block's result does not depend on its lane or on the width: each lane runs the same sequence of IEEE
//! single-precision operations (sums in index order, no fused multiply-adds), which [`Sc`] states in plain Rust, so
//! every instruction-set level writes the same bytes.
//!
//! Per block: find the value of largest magnitude `max`; try the scales that put `max` near either end of the
//! level range (`SPREAD` tenths of a level either side), each with its weighted least-squares scale for the levels
//! it rounds to, and keep the one that removes the most weighted squared error; round that scale to f16 as it is
//! stored and the levels against it; take one more least-squares step from those levels and keep it if its own
//! f16-rounded result has less weighted error.

use half::f16;

use super::search::{QK, SPREAD, Symmetric};
use crate::dispatch::Isa;

/// Below this magnitude a block is all zeros (as ggml's `GROUP_MAX_EPS`).
const EPS: f32 = 1e-15;
/// Scales tried per block: `2·SPREAD + 1` around each end of the level range.
const CANDIDATES: usize = 2 * (2 * SPREAD as usize + 1);

/// Lane-parallel single-precision operations; lane `l` is block `l` of a group. Comparisons are ordered (false
/// when either side is NaN).
pub(crate) trait Wide: Copy {
    /// Lanes (at most 16).
    const N: usize;
    type M: Copy;
    fn splat(v: f32) -> Self;
    /// Lane `l` is `base[idx[l] + off]`; the caller keeps every index in bounds.
    fn gather(base: &[f32], idx: &[i32; 16], off: usize) -> Self;
    /// The blocks at `idx`, one per lane: lane `l` of vector `j` is `base[idx[l] + j]`, `j` in `0..QK` (the caller
    /// keeps every block in bounds).
    #[inline(always)]
    fn load_blocks(base: &[f32], idx: &[i32; 16]) -> [Self; QK] {
        let mut v = [Self::splat(0.0); QK];
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = Self::gather(base, idx, j);
        }
        v
    }
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn gt(self, o: Self) -> Self::M;
    fn lt(self, o: Self) -> Self::M;
    fn ge(self, o: Self) -> Self::M;
    /// `self < o || self > o`.
    fn ne(self, o: Self) -> Self::M;
    fn and(a: Self::M, b: Self::M) -> Self::M;
    /// `m ? a : b`, lane by lane.
    fn select(m: Self::M, a: Self, b: Self) -> Self;
    /// Round to nearest (ties to even, for |v| < 2²²), then `max(·, lo)` and `min(·, hi)` as x86 computes them
    /// (`a > b ? a : b`, `a < b ? a : b`).
    fn round_clamp(self, lo: Self, hi: Self) -> Self;
    /// [`Wide::round_clamp`] without its `max(·, lo)`, for values that cannot round below `lo`.
    fn round_min(self, hi: Self) -> Self;
    /// [`Wide::round_clamp`] without the clamps, for values that cannot round outside the range.
    fn round(self) -> Self;
    /// Rounds to f16 (nearest, ties to even) and back.
    fn f16_round(self) -> Self;
    /// Finite and not zero.
    fn finite_nonzero(self) -> Self::M;
    fn to_array(self) -> [f32; 16];
    /// Each lane (an integer-valued float, |v| < 2³¹) as an integer.
    fn to_ints(self) -> [i32; 16];
}

/// [`Wide`] in plain Rust, 8 lanes: the statement of what every level computes.
#[derive(Clone, Copy)]
pub(crate) struct Sc([f32; 8]);

impl Sc {
    #[inline(always)]
    fn zip(self, o: Sc, f: impl Fn(f32, f32) -> f32) -> Sc {
        Sc(std::array::from_fn(|l| f(self.0[l], o.0[l])))
    }

    #[inline(always)]
    fn cmp(self, o: Sc, f: impl Fn(f32, f32) -> bool) -> [bool; 8] {
        std::array::from_fn(|l| f(self.0[l], o.0[l]))
    }
}

impl Wide for Sc {
    const N: usize = 8;
    type M = [bool; 8];

    fn splat(v: f32) -> Sc {
        Sc([v; 8])
    }

    fn gather(base: &[f32], idx: &[i32; 16], off: usize) -> Sc {
        Sc(std::array::from_fn(|l| base[idx[l] as usize + off]))
    }

    fn add(self, o: Sc) -> Sc {
        self.zip(o, |a, b| a + b)
    }

    fn sub(self, o: Sc) -> Sc {
        self.zip(o, |a, b| a - b)
    }

    fn mul(self, o: Sc) -> Sc {
        self.zip(o, |a, b| a * b)
    }

    fn div(self, o: Sc) -> Sc {
        self.zip(o, |a, b| a / b)
    }

    fn abs(self) -> Sc {
        Sc(self.0.map(f32::abs))
    }

    fn gt(self, o: Sc) -> [bool; 8] {
        self.cmp(o, |a, b| a > b)
    }

    fn lt(self, o: Sc) -> [bool; 8] {
        self.cmp(o, |a, b| a < b)
    }

    fn ge(self, o: Sc) -> [bool; 8] {
        self.cmp(o, |a, b| a >= b)
    }

    fn ne(self, o: Sc) -> [bool; 8] {
        self.cmp(o, |a, b| a.partial_cmp(&b).is_some_and(|o| o.is_ne()))
    }

    fn and(a: [bool; 8], b: [bool; 8]) -> [bool; 8] {
        std::array::from_fn(|l| a[l] && b[l])
    }

    fn select(m: [bool; 8], a: Sc, b: Sc) -> Sc {
        Sc(std::array::from_fn(|l| if m[l] { a.0[l] } else { b.0[l] }))
    }

    fn round_clamp(self, lo: Sc, hi: Sc) -> Sc {
        const MAGIC: f32 = 12582912.0;
        self.zip(lo, |v, lo| {
            let r = (v + MAGIC) - MAGIC;
            if r > lo { r } else { lo }
        })
        .zip(hi, |t, hi| if t < hi { t } else { hi })
    }

    fn round_min(self, hi: Sc) -> Sc {
        self.round().zip(hi, |t, hi| if t < hi { t } else { hi })
    }

    fn round(self) -> Sc {
        const MAGIC: f32 = 12582912.0;
        Sc(self.0.map(|v| (v + MAGIC) - MAGIC))
    }

    fn f16_round(self) -> Sc {
        Sc(self.0.map(|v| f16::from_f32(v).to_f32()))
    }

    fn finite_nonzero(self) -> [bool; 8] {
        self.0.map(|v| v.is_finite() && v != 0.0)
    }

    fn to_array(self) -> [f32; 16] {
        let mut r = [0f32; 16];
        r[..8].copy_from_slice(&self.0);
        r
    }

    fn to_ints(self) -> [i32; 16] {
        std::array::from_fn(|l| if l < 8 { self.0[l] as i32 } else { 0 })
    }
}

/// One group of `V::N` blocks of the same columns: lane `l` is the block at `x[ix[l]..][..32]`, and `w` the
/// weights of its values. Writes each lane's scale (f16-exact) to `d_out` and levels to `q_out[j][l]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn group<V: Wide>(
    x: &[f32],
    w: &[f32; QK],
    ix: &[i32; 16],
    lo: i32,
    hi: i32,
    d_out: &mut [f32; 16],
    q_out: &mut [[i32; 16]; QK],
) {
    let z = V::splat(0.0);
    let xv = V::load_blocks(x, ix);
    // The weights are broadcast where used and `w·x` is formed in each pass that needs it, rather than kept in
    // arrays: arrays of vectors are zeroed before they are filled (three 2 KB memsets per group, ~3% of the
    // search's time in perf), and a broadcast or a multiply costs less than that. (No closure for the broadcast:
    // a closure would be compiled without the caller's target features.)
    let (mut amax, mut max) = (z, z);
    for &xj in &xv {
        // The first value of largest magnitude, its sign kept.
        let a = xj.abs();
        let m = a.gt(amax);
        amax = V::select(m, a, amax);
        max = V::select(m, xj, max);
    }
    let (lo_f, hi_f) = (lo as f32, hi as f32);
    let (lov, hiv) = (V::splat(lo_f), V::splat(hi_f));
    // The candidates' inverse scales: `SPREAD` tenths of a level either side of `max` at each end of the range.
    // (A loop, not `array::from_fn`: a closure would be compiled without the caller's target features.)
    let mut ids = [z; CANDIDATES];
    for (c, id) in ids.iter_mut().enumerate() {
        let end = if c < CANDIDATES / 2 { lo_f } else { hi_f };
        let s = (c % (CANDIDATES / 2)) as i32 - SPREAD;
        *id = V::splat(end + end.signum() * 0.1 * s as f32).div(max);
    }
    // Every candidate in one pass over the values, each with its own sums (in index order, as alone): independent
    // chains that keep the vector units busy, and each value loaded once. Since |x| <= |max|, `x · id` lies within
    // ±(|end| + 0.1·SPREAD) (times 1 + 2⁻²³ at most): at the `lo` end it can round up past `hi` but not below
    // `lo`, at the `hi` end (|hi| = |lo| - 1) it stays in range, so those clamps could never act. (A NaN or
    // infinite value makes a candidate's sums NaN with or without them, and it is never taken.)
    let (mut sxq, mut sqq) = ([z; CANDIDATES], [z; CANDIDATES]);
    for j in 0..QK {
        let wj = V::splat(w[j]);
        let wxj = wj.mul(xv[j]);
        for c in 0..CANDIDATES {
            let v = xv[j].mul(ids[c]);
            let q = if c < CANDIDATES / 2 { v.round_min(hiv) } else { v.round() };
            sxq[c] = sxq[c].add(wxj.mul(q));
            sqq[c] = sqq[c].add(wj.mul(q).mul(q));
        }
    }
    // Best candidate so far by Σwxq² / Σwq² (the error it removes), and its least-squares scale.
    let (mut best, mut best_d) = (V::splat(-1.0), max.div(lov));
    for c in 0..CANDIDATES {
        let (sxq, sqq) = (sxq[c], sqq[c]);
        let better = V::and(sqq.gt(z), sxq.mul(sxq).gt(best.mul(sqq)));
        best = V::select(better, sxq.mul(sxq).div(sqq), best);
        best_d = V::select(better, sxq.div(sqq), best_d);
    }
    // The scale as stored (f16), the levels against it, their least-squares scale and weighted error.
    let one = V::splat(1.0);
    let d0 = best_d.f16_round();
    let ok = V::and(amax.ge(V::splat(EPS)), d0.finite_nonzero());
    let id0 = one.div(d0);
    let (mut sxq, mut sqq, mut e0) = (z, z, z);
    for j in 0..QK {
        let wj = V::splat(w[j]);
        let q = xv[j].mul(id0).round_clamp(lov, hiv);
        sxq = sxq.add(wj.mul(xv[j]).mul(q));
        sqq = sqq.add(wj.mul(q).mul(q));
        let r = xv[j].sub(d0.mul(q));
        e0 = e0.add(wj.mul(r).mul(r));
    }
    let d1 = V::select(sqq.gt(z), sxq.div(sqq), z).f16_round();
    let id1 = one.div(d1);
    let mut e1 = z;
    for j in 0..QK {
        let q = xv[j].mul(id1).round_clamp(lov, hiv);
        let r = xv[j].sub(d1.mul(q));
        e1 = e1.add(V::splat(w[j]).mul(r).mul(r));
    }
    let take1 = V::and(V::and(d1.finite_nonzero(), d1.ne(d0)), e1.lt(e0));
    let (d, id) = (V::select(take1, d1, d0), V::select(take1, id1, id0));
    // A block that is (nearly) zero, or whose scale underflows f16, is stored as zeros.
    *d_out = V::select(ok, d, z).to_array();
    for j in 0..QK {
        q_out[j] = V::select(ok, xv[j].mul(id).round_clamp(lov, hiv), z).to_ints();
    }
}

/// Every block of `x` in groups of `V::N`; see [`symmetric_blocks`]. A group is the blocks of the same columns in
/// consecutive rows, so that its lanes share their weights.
#[inline(always)]
fn blocks<V: Wide>(x: &[f32], importance: Option<&[f32]>, lo: i32, hi: i32, out: &mut [Symmetric]) {
    const ONES: [f32; QK] = [1.0; QK];
    // Without importance, any blocks can share a group: view `x` as one column of blocks.
    let row_blocks = importance.map_or(1, |imp| imp.len() / QK);
    let rows = out.len() / row_blocks;
    let (mut d, mut q) = ([0f32; 16], [[0i32; 16]; QK]);
    // Groups of rows, and along them block by block: each row is read front to back, a pattern the hardware
    // prefetcher follows (going down a column of blocks first made the gathers wait on memory, about a third of the
    // search's time in perf on SmolLM2).
    let mut r0 = 0;
    while r0 < rows {
        let n = V::N.min(rows - r0);
        for cb in 0..row_blocks {
            let w: &[f32; QK] = match importance {
                Some(imp) => imp[cb * QK..(cb + 1) * QK].try_into().expect("a block of weights"),
                None => &ONES,
            };
            let mut ix = [0i32; 16];
            for (l, i) in ix.iter_mut().enumerate().take(V::N) {
                // A short last group repeats its last block in the spare lanes.
                *i = (((r0 + l.min(n - 1)) * row_blocks + cb) * QK) as i32;
            }
            group::<V>(x, w, &ix, lo, hi, &mut d, &mut q);
            for l in 0..n {
                let o = &mut out[(r0 + l) * row_blocks + cb];
                o.d = f16::from_f32(d[l]);
                for (oq, qj) in o.q.iter_mut().zip(&q) {
                    *oq = qj[l] as i8;
                }
            }
        }
        r0 += n;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`Wide`] with 256-bit vectors. Only [`blocks_avx2`] makes one (through `blocks`), and it runs only on CPUs
    /// with AVX2, FMA and F16C (its caller checks), so the intrinsics below always have their features.
    #[derive(Clone, Copy)]
    pub struct A2(__m256);

    // No closures in these impls: a closure is compiled without its caller's target features. Gathers read
    // `base[idx[l] + off]`, which `blocks` keeps in bounds (`symmetric_blocks_at` checks the lengths).
    impl Wide for A2 {
        const N: usize = 8;
        type M = __m256;

        #[inline(always)]
        fn splat(v: f32) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_set1_ps(v)) }
        }
        #[inline(always)]
        fn gather(base: &[f32], idx: &[i32; 16], off: usize) -> A2 {
            // SAFETY: gathers in bounds (see `blocks`), features as `A2` says.
            unsafe {
                let iv = _mm256_loadu_si256(idx.as_ptr().cast());
                A2(_mm256_i32gather_ps::<4>(base.as_ptr().add(off), iv))
            }
        }
        #[inline(always)]
        fn add(self, o: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_add_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn sub(self, o: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_sub_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn mul(self, o: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_mul_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn div(self, o: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_div_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn abs(self) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0)) }
        }
        #[inline(always)]
        fn gt(self, o: A2) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn lt(self, o: A2) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ge(self, o: A2) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe { _mm256_cmp_ps::<_CMP_GE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ne(self, o: A2) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe { _mm256_cmp_ps::<_CMP_NEQ_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn and(a: __m256, b: __m256) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe { _mm256_and_ps(a, b) }
        }
        #[inline(always)]
        fn select(m: __m256, a: A2, b: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_blendv_ps(b.0, a.0, m)) }
        }
        #[inline(always)]
        fn round_clamp(self, lo: A2, hi: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe {
                let magic = _mm256_set1_ps(12582912.0);
                let r = _mm256_sub_ps(_mm256_add_ps(self.0, magic), magic);
                A2(_mm256_min_ps(_mm256_max_ps(r, lo.0), hi.0))
            }
        }
        #[inline(always)]
        fn round_min(self, hi: A2) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_min_ps(self.round().0, hi.0)) }
        }
        #[inline(always)]
        fn round(self) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe {
                let magic = _mm256_set1_ps(12582912.0);
                A2(_mm256_sub_ps(_mm256_add_ps(self.0, magic), magic))
            }
        }
        #[inline(always)]
        fn f16_round(self) -> A2 {
            // SAFETY: features as `A2` says.
            unsafe { A2(_mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0))) }
        }
        #[inline(always)]
        fn finite_nonzero(self) -> __m256 {
            // SAFETY: features as `A2` says.
            unsafe {
                let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(self.abs().0, _mm256_set1_ps(f32::INFINITY));
                _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_NEQ_OQ>(self.0, _mm256_setzero_ps()))
            }
        }
        #[inline(always)]
        fn to_array(self) -> [f32; 16] {
            let mut r = [0f32; 16];
            // SAFETY: features as `A2` says.
            unsafe { _mm256_storeu_ps(r.as_mut_ptr(), self.0) };
            r
        }
        #[inline(always)]
        fn to_ints(self) -> [i32; 16] {
            let mut r = [0i32; 16];
            // SAFETY: features as `A2` says.
            unsafe { _mm256_storeu_si256(r.as_mut_ptr().cast(), _mm256_cvtps_epi32(self.0)) };
            r
        }
    }

    /// [`Wide`] with 512-bit vectors and mask registers; made only by [`blocks_avx512`], on CPUs with the
    /// AVX-512 level's features.
    #[derive(Clone, Copy)]
    #[repr(transparent)]
    pub struct A5(__m512);

    impl Wide for A5 {
        const N: usize = 16;
        type M = __mmask16;

        #[inline(always)]
        fn splat(v: f32) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_set1_ps(v)) }
        }
        #[inline(always)]
        fn gather(base: &[f32], idx: &[i32; 16], off: usize) -> A5 {
            // SAFETY: gathers in bounds (see `blocks`), features as `A5` says.
            unsafe {
                let iv = _mm512_loadu_si512(idx.as_ptr().cast());
                A5(_mm512_i32gather_ps::<4>(iv, base.as_ptr().add(off)))
            }
        }
        /// Two 16×16 transposes of the blocks' halves (64 shuffles each) instead of 32 gathers: on the AMD Zen 4
        /// this runs on, perf put a third of the search's time on the gathers.
        #[inline(always)]
        fn load_blocks(base: &[f32], idx: &[i32; 16]) -> [A5; QK] {
            // Both halves side by side, with no zero-filled array of the whole to copy them into (its memset was
            // a call per group).
            let halves = [half_blocks(base, idx, 0), half_blocks(base, idx, 16)];
            // SAFETY: `[[__m512; 16]; 2]` and `[A5; 32]` have the same size and layout (`A5` is a transparent
            // `__m512`, arrays are contiguous); every bit pattern is a valid `__m512`.
            unsafe { std::mem::transmute::<[[__m512; 16]; 2], [A5; QK]>(halves) }
        }
        #[inline(always)]
        fn add(self, o: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_add_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn sub(self, o: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_sub_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn mul(self, o: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_mul_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn div(self, o: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_div_ps(self.0, o.0)) }
        }
        #[inline(always)]
        fn abs(self) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_abs_ps(self.0)) }
        }
        #[inline(always)]
        fn gt(self, o: A5) -> __mmask16 {
            // SAFETY: features as `A5` says.
            unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn lt(self, o: A5) -> __mmask16 {
            // SAFETY: features as `A5` says.
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ge(self, o: A5) -> __mmask16 {
            // SAFETY: features as `A5` says.
            unsafe { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ne(self, o: A5) -> __mmask16 {
            // SAFETY: features as `A5` says.
            unsafe { _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn and(a: __mmask16, b: __mmask16) -> __mmask16 {
            a & b
        }
        #[inline(always)]
        fn select(m: __mmask16, a: A5, b: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_mask_blend_ps(m, b.0, a.0)) }
        }
        #[inline(always)]
        fn round_clamp(self, lo: A5, hi: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe {
                let magic = _mm512_set1_ps(12582912.0);
                let r = _mm512_sub_ps(_mm512_add_ps(self.0, magic), magic);
                A5(_mm512_min_ps(_mm512_max_ps(r, lo.0), hi.0))
            }
        }
        #[inline(always)]
        fn round_min(self, hi: A5) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_min_ps(self.round().0, hi.0)) }
        }
        #[inline(always)]
        fn round(self) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe {
                let magic = _mm512_set1_ps(12582912.0);
                A5(_mm512_sub_ps(_mm512_add_ps(self.0, magic), magic))
            }
        }
        #[inline(always)]
        fn f16_round(self) -> A5 {
            // SAFETY: features as `A5` says.
            unsafe { A5(_mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0))) }
        }
        #[inline(always)]
        fn finite_nonzero(self) -> __mmask16 {
            // SAFETY: features as `A5` says.
            unsafe {
                let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.abs().0, _mm512_set1_ps(f32::INFINITY));
                finite & _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(self.0, _mm512_setzero_ps())
            }
        }
        #[inline(always)]
        fn to_array(self) -> [f32; 16] {
            let mut r = [0f32; 16];
            // SAFETY: features as `A5` says.
            unsafe { _mm512_storeu_ps(r.as_mut_ptr(), self.0) };
            r
        }
        #[inline(always)]
        fn to_ints(self) -> [i32; 16] {
            let mut r = [0i32; 16];
            // SAFETY: features as `A5` says.
            unsafe { _mm512_storeu_si512(r.as_mut_ptr().cast(), _mm512_cvtps_epi32(self.0)) };
            r
        }
    }

    /// Values `off..off + 16` of the 16 blocks at `idx`, one vector per value (lane `l` from block `l`).
    #[inline(always)]
    fn half_blocks(base: &[f32], idx: &[i32; 16], off: usize) -> [__m512; 16] {
        // SAFETY (both blocks): only called from `A5::load_blocks`, under the AVX-512 level's features; each block
        // `base[idx[l]..][..QK]` is in bounds (see `blocks`) and `off + 16 <= QK`.
        let mut rows = [unsafe { _mm512_setzero_ps() }; 16];
        for (l, row) in rows.iter_mut().enumerate() {
            *row = unsafe { _mm512_loadu_ps(base.as_ptr().add(idx[l] as usize + off)) };
        }
        transpose16(rows)
    }

    /// Transposes 16 rows of 16 floats: element `c` of output `r` is element `r` of input `c`.
    #[inline(always)]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // SAFETY (every block below): only called from `A5::load_blocks`, under the AVX-512 level's features.
        // 32-bit interleave of row pairs: in 128-bit lane k, t[2i] = rows 2i, 2i+1 at 4k, 4k+1 and t[2i + 1] the
        // same at 4k+2, 4k+3.
        let mut t = [r[0]; 16];
        for i in 0..8 {
            unsafe {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
        }
        // 64-bit interleave: in lane k, u[4g + c] = rows 4g..4g+3 at element 4k + c.
        let mut u = [r[0]; 16];
        for g in 0..4 {
            unsafe {
                let (a, b) = (_mm512_castps_pd(t[4 * g]), _mm512_castps_pd(t[4 * g + 2]));
                let (c, d) = (_mm512_castps_pd(t[4 * g + 1]), _mm512_castps_pd(t[4 * g + 3]));
                u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
                u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
                u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
                u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
            }
        }
        // Gather lane k of u[c], u[4 + c], u[8 + c], u[12 + c] into output 4k + c.
        let mut out = [r[0]; 16];
        for c in 0..4 {
            unsafe {
                let v0 = _mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]);
                let v1 = _mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]);
                let v2 = _mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]);
                let v3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]);
                out[c] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
                out[4 + c] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
                out[8 + c] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
                out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
            }
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn blocks_avx2(x: &[f32], imp: Option<&[f32]>, lo: i32, hi: i32, out: &mut [Symmetric]) {
        blocks::<A2>(x, imp, lo, hi, out)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn blocks_avx512(x: &[f32], imp: Option<&[f32]>, lo: i32, hi: i32, out: &mut [Symmetric]) {
        blocks::<A5>(x, imp, lo, hi, out)
    }
}

/// Searches every 32-value block of `x` for its symmetric block (levels `lo..=hi`) into `out` (one per block),
/// trying `2·SPREAD + 1` scales around each end of the level range `lo..=hi` (which must be `-(hi + 1)..=hi`). `importance`, if given, weighs each column of
/// rows of `importance.len()` values (`x` is whole rows); else every value weighs 1.
pub(crate) fn symmetric_blocks(x: &[f32], importance: Option<&[f32]>, lo: i32, hi: i32, out: &mut [Symmetric]) {
    symmetric_blocks_at(crate::dispatch::isa(), x, importance, lo, hi, out)
}

/// [`symmetric_blocks`] for `x.len() / 32` blocks into a buffer of this thread's, reused from call to call, which
/// `f` then reads. (A new vector per call was zeroed only to be overwritten: 2% of the q4_0 search's time in perf.)
pub(crate) fn with_symmetric_blocks<R>(
    x: &[f32],
    importance: Option<&[f32]>,
    lo: i32,
    hi: i32,
    f: impl FnOnce(&[Symmetric]) -> R,
) -> R {
    thread_local! {
        static BLOCKS: std::cell::RefCell<Vec<Symmetric>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BLOCKS.with_borrow_mut(|buf| {
        let n = x.len() / QK;
        if buf.len() < n {
            buf.resize(n, Symmetric::default());
        }
        symmetric_blocks(x, importance, lo, hi, &mut buf[..n]);
        f(&buf[..n])
    })
}

/// [`symmetric_blocks`] at a given level (which the CPU must have).
pub(crate) fn symmetric_blocks_at(
    isa: Isa,
    x: &[f32],
    importance: Option<&[f32]>,
    lo: i32,
    hi: i32,
    out: &mut [Symmetric],
) {
    assert_eq!(x.len(), out.len() * QK, "{} values for {} blocks", x.len(), out.len());
    assert!(x.len() <= i32::MAX as usize, "gather indices are 32-bit");
    // `group` relies on this shape of range to skip clamps.
    assert!(hi >= 1 && lo == -hi - 1, "levels {lo}..={hi} are not -(n + 1)..=n");
    if let Some(imp) = importance {
        assert!(
            !imp.is_empty() && imp.len().is_multiple_of(QK) && x.len().is_multiple_of(imp.len()),
            "{} importance values for {} values",
            imp.len(),
            x.len()
        );
    }
    assert!(isa.is_supported(), "{isa:?} is not available on this CPU");
    match isa.vectors() {
        // SAFETY: the level is supported (checked above), and its features include those enabled by the call.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::blocks_avx512(x, importance, lo, hi, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::blocks_avx2(x, importance, lo, hi, out) },
        _ => blocks::<Sc>(x, importance, lo, hi, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// Rows of 7 blocks (so that groups straddle rows and end short), with varied magnitudes, all-zero and
    /// nearly-zero blocks, blocks whose scale underflows f16 and ones that overflow it.
    fn data(seed: &mut u64) -> (Vec<f32>, Vec<f32>) {
        let row = 7 * QK;
        let mut x = Vec::new();
        for b in 0..7 * 23 {
            let scale = match b % 11 {
                0 => 0.0,
                1 => 1e-16,
                2 => 1e-9,
                3 => 1e6,
                4 => 3e-5,
                _ => 1.0 + 10.0 * lcg(seed).abs(),
            };
            x.extend((0..QK).map(|_| lcg(seed) * scale));
        }
        let imp = (0..row).map(|_| 1e-3 + lcg(seed).abs() * (1.0 + 100.0 * lcg(seed).abs())).collect();
        (x, imp)
    }

    #[test]
    fn every_level_gives_the_same_blocks() {
        let levels: Vec<Isa> = Isa::ALL.into_iter().filter(|l| l.is_supported()).collect();
        eprintln!("levels compared: {levels:?}");
        let mut seed = 3;
        let (x, imp) = data(&mut seed);
        let nb = x.len() / QK;
        for (lo, hi) in [(-8, 7), (-16, 15)] {
            for importance in [None, Some(&imp[..])] {
                let run = |isa: Isa| {
                    let mut out = vec![Symmetric::default(); nb];
                    symmetric_blocks_at(isa, &x, importance, lo, hi, &mut out);
                    out.iter().map(|s| (s.d.to_bits(), s.q)).collect::<Vec<_>>()
                };
                let want = run(Isa::Scalar);
                // The zero-ish blocks come out as zeros, with a zero scale.
                assert_eq!(want[0], (0, [0; QK]));
                assert_eq!(want[1], (0, [0; QK]));
                assert!(want[5].0 != 0 && want[5].1.iter().all(|&q| (lo..=hi).contains(&(q as i32))));
                for &isa in &levels[1..] {
                    assert_eq!(
                        run(isa),
                        want,
                        "{isa:?} vs scalar, levels {lo}..={hi}, importance {}",
                        importance.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn a_block_in_a_group_comes_out_as_it_does_alone() {
        let mut seed = 5;
        let (x, imp) = data(&mut seed);
        let row = imp.len();
        let mut all = vec![Symmetric::default(); x.len() / QK];
        symmetric_blocks(&x, Some(&imp), -8, 7, &mut all);
        for b in [0, 5, 6, 7, 12, 100] {
            let mut one = [Symmetric::default()];
            let col = b * QK % row;
            symmetric_blocks(&x[b * QK..][..QK], Some(&imp[col..][..QK]), -8, 7, &mut one);
            assert_eq!((one[0].d.to_bits(), one[0].q), (all[b].d.to_bits(), all[b].q), "block {b}");
        }
    }
}
