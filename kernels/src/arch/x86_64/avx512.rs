//! AVX-512 (F, BW, VL, VNNI) kernels: the same loops as AVX2, with the 8-bit dot product done by one VNNI
//! instruction (`vpdpbusd`: four u8×i8 products summed straight into each i32 lane, no 16-bit saturation), so
//! Q8_0 weights can simply be biased to unsigned (w + 128) and the bias removed through Σq.

use std::arch::x86_64::*;

use crate::dispatch::{QUANT_RUN, block_runs, block_scale, put_block, residual_scale};

/// Q8_0 weights are biased by +128 (flipping the top bit) to make them unsigned.
const Q8_0_OFF: i32 = 128;

/// `acc` + Σ u·q over each group of four bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_u8i8(acc: __m256i, u: __m256i, q: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, q)
}

/// `acc` + Σ (w + 128)·q: flipping the sign bit of a two's-complement byte adds 128 to it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_q8_0(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), q)
}

/// `acc` + the pairwise i16 products of `p` and `s`, summed into i32 lanes (`vpdpwssd`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn madd16_acc(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, s)
}

x86_kernels!(
    features = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    isa = crate::dispatch::Isa::Avx512,
    tile32 = 4 x 4,
    kernel32 = tile32z: W32Z,
    tilek = 2 x 4,
    packed = Some(|w, panels, act, n, g, out| {
        // SAFETY: see KERNELS.
        unsafe { crate::arch::packed512::panel(w, panels, act, n, g, out) }
    }),
    packed_f = Some(|w, panels, x, n, out| {
        // SAFETY: see KERNELS.
        unsafe { crate::arch::packed512::panel_f(w, panels, x, n, out) }
    }),
    packed_formats = &[
        crate::packed::PackedFormat::Q4,
        crate::packed::PackedFormat::Q5,
        crate::packed::PackedFormat::Q8,
        crate::packed::PackedFormat::K4,
        crate::packed::PackedFormat::K6,
        crate::packed::PackedFormat::F32,
        crate::packed::PackedFormat::F16,
    ],
    attention = [dot_cols_f32_zmm, dot_cols_f16_zmm, axpy_rows_f32_zmm, axpy_rows_f16_zmm, f16_to_f32_zmm],
    quantize32 = quantize32_zmm,
    task_rows = crate::arch::packed512::ACT_CHUNK
);

/// [`crate::dispatch::quantize_row32`] with one 32-value block in two 512-bit registers, producing the same bytes as
/// the portable code and the 256-bit form (same products, no fused multiply-adds, rounding to nearest-even); the
/// narrowing to bytes is one `vpmovdb` per 16 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn quantize32_zmm(x: &[f32], group: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32], isum: &mut [i32]) {
    assert!(group == 1 || group == 2);
    let cols = x.len();
    let nb = cols / 32;
    assert!(cols.is_multiple_of(32) && qs.len() == group * cols && d.len() == group * nb);
    assert!(s.len() == group * nb && isum.len() == group * nb);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    // Rounds, clamps to ±127 and narrows 2×16 floats to bytes in order (stored at `dst`); returns their sum and the
    // rounded values as floats.
    let quant = |v: [__m512; 2], id: f32, dst: &mut [i8]| -> (i32, [__m512; 2]) {
        let dst = &mut dst[..32];
        let idv = _mm512_set1_ps(id);
        let rf: [__m512; 2] = std::array::from_fn(|k| {
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v[k], idv));
            _mm512_min_ps(_mm512_max_ps(r, lo), hi)
        });
        let q: [__m512i; 2] = std::array::from_fn(|k| _mm512_cvtps_epi32(rf[k]));
        for (k, qk) in q.iter().enumerate() {
            // SAFETY: `dst` has 32 bytes; this writes 16 of them at 16·k. No alignment requirement.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().add(16 * k).cast(), _mm512_cvtepi32_epi8(*qk)) };
        }
        (_mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1])), rf)
    };
    let load = |b: usize| -> [__m512; 2] {
        let xb = &x[b * 32..b * 32 + 32];
        // SAFETY: the slice above has 32 values.
        std::array::from_fn(|k| unsafe { _mm512_loadu_ps(xb.as_ptr().add(16 * k)) })
    };
    // The scales of a whole run of blocks first, then its quantization (see `QUANT_RUN`).
    for run in block_runs(nb) {
        let mut scale = [(0f32, 0f32); QUANT_RUN];
        for (sc, b) in scale.iter_mut().zip(run.clone()) {
            let v = load(b);
            *sc = block_scale(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1]))));
        }
        for (&(d1, id1), b) in scale.iter().zip(run) {
            let v = load(b);
            let (sum1, r1) = quant(v, id1, &mut qs[b * 32..]);
            let residual = if group == 2 {
                let (d2, id2) = residual_scale(d1, id1);
                // Residual x − d1·q1 (a product, then a difference: no fused multiply-add, as in the portable
                // code).
                let d1v = _mm512_set1_ps(d1);
                let res: [__m512; 2] = std::array::from_fn(|k| _mm512_sub_ps(v[k], _mm512_mul_ps(d1v, r1[k])));
                let (sum2, _) = quant(res, id2, &mut qs[cols + b * 32..]);
                Some((d2, sum2))
            } else {
                None
            };
            put_block((&mut *d, &mut *s, &mut *isum), nb, b, (d1, sum1), residual);
        }
    }
}

// -------------------------------------------------------------------------------------------------------------
// 512-bit attention kernels: 16 lanes (one KV block) of scores, or 16 value dimensions, per register. Per
// element the arithmetic is the one `vec_f32::dot_cols_ref` / `axpy_rows_ref` state, as in the 256-bit forms,
// so every level agrees bit for bit; they take over what does not fill a 512-bit register.

/// Sixteen cached keys or values from `p..p + 16` as f32.
trait Z: Copy {
    /// # Safety
    /// Sixteen elements must be readable at `p`; the CPU must have AVX-512 F (and F16C).
    unsafe fn ldz(p: *const Self) -> __m512;
}

impl Z for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn ldz(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable values; no alignment requirement.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Z for f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn ldz(p: *const f16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable values (32 bytes); no alignment requirement.
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_cols_f32_zmm(q: &[f32], kt: &[f32], lanes: usize, out: &mut [f32]) {
    if lanes.is_multiple_of(16) {
        // SAFETY: this function has the features.
        unsafe { dot_cols_z(q, kt, lanes, out) }
    } else {
        dot_cols_f32(q, kt, lanes, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_cols_f16_zmm(q: &[f32], kt: &[f16], lanes: usize, out: &mut [f32]) {
    if lanes.is_multiple_of(16) {
        // SAFETY: this function has the features.
        unsafe { dot_cols_z(q, kt, lanes, out) }
    } else {
        dot_cols_f16(q, kt, lanes, out)
    }
}

/// [`crate::vec_f32::f16_to_f32`], sixteen values per conversion (tiled prefill attention converts every block it
/// reads; the 256-bit form took 8-10% of a prefill at 4,096 positions); the 256-bit form finishes the tail.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f16_to_f32_zmm(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: {} values into {}", src.len(), dst.len());
    let body = src.len() - src.len() % 16;
    for (s, d) in src[..body].chunks_exact(16).zip(dst[..body].chunks_exact_mut(16)) {
        // SAFETY: both chunks hold 16 values; unaligned load and store.
        unsafe { _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast()))) };
    }
    f16_to_f32(&src[body..], &mut dst[body..]);
}

/// [`crate::vec_f32::dot_cols`] for `lanes` a multiple of 16: tiles of up to 4 heads × 16 lanes, both partial
/// sums of each in registers, one key load per dimension for every head of the tile.
///
/// # Safety
/// The CPU must have this level's features; `lanes` must be a multiple of 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_cols_z<W: Z>(q: &[f32], kt: &[W], lanes: usize, out: &mut [f32]) {
    let (hd, heads) = crate::vec_f32::dot_cols_shape(q.len(), kt.len(), lanes, out.len());
    assert!(lanes.is_multiple_of(16));
    for j in (0..lanes).step_by(16) {
        let mut h = 0;
        while h < heads {
            let hh = (heads - h).min(4);
            // SAFETY: the shape is checked, so heads h..h + hh and lanes j..j + 16 lie inside q, kt and out.
            unsafe {
                match hh {
                    4 => cols_z::<W, 4>(q, kt, lanes, hd, h, j, out),
                    3 => cols_z::<W, 3>(q, kt, lanes, hd, h, j, out),
                    2 => cols_z::<W, 2>(q, kt, lanes, hd, h, j, out),
                    _ => cols_z::<W, 1>(q, kt, lanes, hd, h, j, out),
                }
            }
            h += hh;
        }
    }
}

/// Heads `h0..h0 + H` × lanes `j..j + 16` of [`dot_cols_z`].
///
/// # Safety
/// Those heads and lanes must exist in `q`, `kt` and `out`; the CPU must have this level's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn cols_z<W: Z, const H: usize>(
    q: &[f32],
    kt: &[W],
    lanes: usize,
    hd: usize,
    h0: usize,
    j: usize,
    out: &mut [f32],
) {
    // SAFETY: offsets stay below h0·hd + H·hd ≤ q.len(), (hd − 1)·lanes + j + 16 ≤ kt.len() and
    // (h0 + H − 1)·lanes + j + 16 ≤ out.len(), by the caller's contract.
    unsafe {
        let qp = q.as_ptr().add(h0 * hd);
        let kp = kt.as_ptr().add(j);
        let mut even = [_mm512_setzero_ps(); H];
        let mut odd = [_mm512_setzero_ps(); H];
        let step = |acc: &mut [__m512; H], d: usize| {
            let k = W::ldz(kp.add(d * lanes));
            for h in 0..H {
                acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(h * hd + d)), k, acc[h]);
            }
        };
        let mut d = 0;
        while d + 2 <= hd {
            step(&mut even, d);
            step(&mut odd, d + 1);
            d += 2;
        }
        if d < hd {
            step(&mut even, d);
        }
        let op = out.as_mut_ptr().add(h0 * lanes + j);
        for h in 0..H {
            _mm512_storeu_ps(op.add(h * lanes), _mm512_add_ps(even[h], odd[h]));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn axpy_rows_f32_zmm(a: AxpyRows<'_>, v: &[f32], out: &mut [f32]) {
    if a.width.is_multiple_of(16) {
        // SAFETY: this function has the features.
        unsafe { axpy_rows_z(a, v, out) }
    } else {
        axpy_rows_f32(a, v, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn axpy_rows_f16_zmm(a: AxpyRows<'_>, v: &[f16], out: &mut [f32]) {
    if a.width.is_multiple_of(16) {
        // SAFETY: this function has the features.
        unsafe { axpy_rows_z(a, v, out) }
    } else {
        axpy_rows_f16(a, v, out)
    }
}

/// [`crate::vec_f32::axpy_rows`] for widths that are a multiple of 16: up to 4 heads × 64 outputs (16 registers)
/// stay in registers while the run's rows stream past, each row loaded once for all of them; then 16 outputs at a
/// time.
///
/// # Safety
/// The CPU must have this level's features; the width must be a multiple of 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn axpy_rows_z<W: Z>(a: AxpyRows<'_>, v: &[W], out: &mut [f32]) {
    let heads = a.heads(v.len(), out.len());
    let width = a.width;
    assert!(width.is_multiple_of(16));
    if a.n == 0 {
        return;
    }
    let mut h = 0;
    while h < heads {
        let hh = (heads - h).min(4);
        let mut i = 0;
        // SAFETY (all tiles): `heads` checked the lengths, so heads h..h + hh, rows 0..n and outputs i..i + 16V
        // (≤ width) lie inside w, v and out.
        unsafe {
            while i + 64 <= width {
                match hh {
                    4 => rows_z::<W, 4, 4>(&a, v, out, h, i),
                    3 => rows_z::<W, 3, 4>(&a, v, out, h, i),
                    2 => rows_z::<W, 2, 4>(&a, v, out, h, i),
                    _ => rows_z::<W, 1, 4>(&a, v, out, h, i),
                }
                i += 64;
            }
            while i < width {
                match hh {
                    4 => rows_z::<W, 4, 1>(&a, v, out, h, i),
                    3 => rows_z::<W, 3, 1>(&a, v, out, h, i),
                    2 => rows_z::<W, 2, 1>(&a, v, out, h, i),
                    _ => rows_z::<W, 1, 1>(&a, v, out, h, i),
                }
                i += 16;
            }
        }
        h += hh;
    }
}

/// Heads `h0..h0 + H` × outputs `i..i + 16·V` of [`axpy_rows_z`].
///
/// # Safety
/// Those heads and outputs, and the `n` rows, must exist in `a.w`, `v` and `out`; the CPU must have this level's
/// features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_z<W: Z, const H: usize, const V: usize>(
    a: &AxpyRows<'_>,
    v: &[W],
    out: &mut [f32],
    h0: usize,
    i: usize,
) {
    // SAFETY: offsets stay below (h0 + H − 1)·width + i + 16V ≤ out.len(), (n − 1)·v_stride + i + 16V ≤ v.len()
    // and (h0 + H − 1)·w_stride + n ≤ w.len(), by the caller's contract.
    unsafe {
        let op = out.as_mut_ptr().add(h0 * a.width + i);
        let wp = a.w.as_ptr().add(h0 * a.w_stride);
        let vp = v.as_ptr().add(i);
        let mut acc: [[__m512; V]; H] =
            std::array::from_fn(|h| std::array::from_fn(|x| _mm512_loadu_ps(op.add(h * a.width + 16 * x))));
        for j in 0..a.n {
            let row: [__m512; V] = std::array::from_fn(|x| W::ldz(vp.add(j * a.v_stride + 16 * x)));
            for h in 0..H {
                let wb = _mm512_set1_ps(*wp.add(h * a.w_stride + j));
                for x in 0..V {
                    acc[h][x] = _mm512_fmadd_ps(wb, row[x], acc[h][x]);
                }
            }
        }
        for h in 0..H {
            for x in 0..V {
                _mm512_storeu_ps(op.add(h * a.width + 16 * x), acc[h][x]);
            }
        }
    }
}

// -------------------------------------------------------------------------------------------------------------
// 512-bit kernel for the 32-weight blocks: two blocks per register. Lanes 0..8 of every i32/f32 vector belong to
// the even block, lanes 8..16 to the odd one, so the per-block scales are (d_even ×8, d_odd ×8) vectors. An odd
// last block goes through the 256-bit step of the shared code (the SIMD loop advances the block index, the
// narrower step finishes).

/// Two consecutive blocks unpacked to 64 unsigned bytes in weight order.
trait W32Z: W32 {
    /// # Safety
    /// The CPU must have this level's features.
    unsafe fn unpack2(a: &Self, b: &Self) -> __m512i;
    /// `acc` + Σ u·q per i32 lane, 64 bytes.
    ///
    /// # Safety
    /// As `unpack2`.
    unsafe fn dot2(acc: __m512i, u: __m512i, q: __m512i) -> __m512i {
        // SAFETY: the caller has this level's features.
        unsafe { dpbusd512(acc, u, q) }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dpbusd512(acc: __m512i, u: __m512i, q: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, u, q)
}

/// The nibbles of two 4-bit blocks in weight order: each block's 16 bytes fill two 128-bit lanes, the second copy
/// shifted right by 4, so after masking to 0..15 the lanes hold (low a = weights 0..16 of a, high a, low b, high b).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn nibbles2(a: &[u8; 16], b: &[u8; 16]) -> __m512i {
    let va = _mm256_broadcastsi128_si256(ld16b(a));
    let vb = _mm256_broadcastsi128_si256(ld16b(b));
    let v = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
    // 128-bit lanes 1 and 3 (the second copy of each block) move their high nibbles down.
    let shifted = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

impl W32Z for BlockQ4_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(a: &Self, b: &Self) -> __m512i {
        nibbles2(&a.qs, &b.qs)
    }
}
impl W32Z for BlockQ4_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(a: &Self, b: &Self) -> __m512i {
        nibbles2(&a.qs, &b.qs)
    }
}
impl W32Z for BlockQ5_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(a: &Self, b: &Self) -> __m512i {
        // SAFETY: the caller has this level's features.
        unsafe { _mm512_inserti64x4(_mm512_castsi256_si512(a.unpack()), b.unpack(), 1) }
    }
}
impl W32Z for BlockQ8_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(a: &Self, b: &Self) -> __m512i {
        _mm512_inserti64x4(_mm512_castsi256_si512(ld32(&a.qs)), ld32(&b.qs), 1)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot2(acc: __m512i, w: __m512i, q: __m512i) -> __m512i {
        // w + 128 by flipping the sign bit, as in `dot_q8_0`.
        _mm512_dpbusd_epi32(acc, _mm512_xor_si512(w, _mm512_set1_epi8(-128)), q)
    }
}

/// 64 bytes from a slice of exactly 64 (panics otherwise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ld64(s: &[i8]) -> __m512i {
    assert_eq!(s.len(), 64);
    // SAFETY: 64 readable bytes; no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// (a ×8, b ×8) from two f16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn h2_pair(a: f16, b: f16) -> __m512 {
    let bits = _mm256_castsi128_si256(_mm_cvtsi32_si128((a.to_bits() as u32 | (b.to_bits() as u32) << 16) as i32));
    let idx = _mm256_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_cvtph_ps(_mm256_permutexvar_epi16(idx, bits))
}

/// (`s[i]` ×8, `s[i + 1]` ×8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f2_pair(s: &[f32], i: usize) -> __m512 {
    let p = &s[i..i + 2];
    // SAFETY: the slice above holds two f32 = 8 readable bytes.
    let v = unsafe { _mm_loadl_epi64(p.as_ptr().cast()) };
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castsi128_ps(v)))
}

/// (`v[i]` in lane 0, `v[i + 1]` in lane 8, zeros elsewhere), times `k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn i2_seed(v: &[i32], i: usize, k: i32) -> __m512i {
    let p = &v[i..i + 2];
    // SAFETY: the slice above holds two i32 = 8 readable bytes.
    let x = unsafe { _mm_loadl_epi64(p.as_ptr().cast()) };
    let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let spread = _mm512_maskz_permutexvar_epi32(0x0101, idx, _mm512_castsi128_si512(x));
    _mm512_mullo_epi32(spread, _mm512_set1_epi32(k))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile32z<B: W32Z, const R: usize, const C: usize, const G: usize>(
    w: [&[B]; R],
    act: Act32<'_>,
    o0: usize,
    nb: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut b = 0;
    while b + 2 <= nb {
        let mut u = [_mm512_setzero_si512(); R];
        let mut wd = [_mm512_setzero_ps(); R];
        let mut wm = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // Prefetch hint 128 blocks ahead (2.5-4 KB, about DRAM latency × bandwidth; measured best of 16/64/128):
            // decode streams the weights from DRAM once. A hint cannot fault past the row, and `wrapping_add`
            // keeps the address computation defined.
            _mm_prefetch::<_MM_HINT_T0>(w[r].as_ptr().wrapping_add(b + 128).cast());
        }
        for r in 0..R {
            let (x, y) = (&w[r][b], &w[r][b + 1]);
            // SAFETY: the caller has this level's features.
            u[r] = unsafe { B::unpack2(x, y) };
            wd[r] = h2_pair(x.d(), y.d());
            if B::HAS_MIN {
                // The min term m·s once per block: only lanes 0 and 8 carry it.
                wm[r] = _mm512_maskz_mov_ps(0x0101, h2_pair(x.m(), y.m()));
            }
        }
        for c in 0..C {
            let i = (o0 + c) * G * nb + b;
            let q = ld64(&act.qs[i * 32..i * 32 + 64]);
            // −OFF·Σq of each block, in its first lane: the lanes then sum to Σ (u − OFF)·q exactly.
            let seed = if B::OFF != 0 { i2_seed(act.isum, i, -B::OFF) } else { _mm512_setzero_si512() };
            let s = if B::HAS_MIN { f2_pair(act.s, i) } else { _mm512_setzero_ps() };
            // With G == 2 the residual row (scale d1/256) follows: 256·Σ(u−OFF)·q1 + Σ(u−OFF)·q2, scaled by d2.
            let (mut q2, mut seed2, mut ad) = (_mm512_setzero_si512(), _mm512_setzero_si512(), f2_pair(act.d, i));
            if G == 2 {
                let i2 = i + nb;
                q2 = ld64(&act.qs[i2 * 32..i2 * 32 + 64]);
                seed2 = if B::OFF != 0 { i2_seed(act.isum, i2, -B::OFF) } else { _mm512_setzero_si512() };
                ad = f2_pair(act.d, i2);
            }
            for r in 0..R {
                // SAFETY (both): the caller has this level's features.
                let mut iv = unsafe { B::dot2(seed, u[r], q) };
                if G == 2 {
                    iv = _mm512_add_epi32(_mm512_slli_epi32(iv, 8), unsafe { B::dot2(seed2, u[r], q2) });
                }
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(wd[r], ad), acc[r][c]);
                if B::HAS_MIN {
                    acc[r][c] = _mm512_fmadd_ps(wm[r], s, acc[r][c]);
                }
            }
        }
        b += 2;
    }
    let mut res = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            res[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    if b < nb {
        // The odd last block, 256 bits wide.
        // SAFETY: the caller has this level's features.
        let t = unsafe { tile32_blocks::<B, R, C, G>(w, act, o0, nb, b..nb) };
        for r in 0..R {
            for c in 0..C {
                res[r][c] += t[r][c];
            }
        }
    }
    res
}
