//! AVX2 + FMA + F16C kernels (any x86-64 from 2013 on). 8-bit products go through `maddubs` (u8×i8 → pairs
//! summed in i16) and `madd` (i16 pairs → i32); that is exact as long as the unsigned weight is at most 127, so
//! signed Q8_0 weights move their sign onto the activation instead of being biased by 128.

use std::arch::x86_64::*;

use crate::dispatch::{QUANT_RUN, block_runs, block_scale, put_block, residual_scale};

/// Q8_0 weights stay signed on this level (see [`dot_q8_0`]).
const Q8_0_OFF: i32 = 0;

/// `acc` + Σ u·q over each group of four bytes (u ≤ 127, so the i16 pair sums, at most 2·127·127, cannot
/// saturate).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8i8(acc: __m256i, u: __m256i, q: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)))
}

/// `acc` + Σ w·q for signed w: |w|·(q with w's sign) has the same products with |w| ≤ 127, |q| ≤ 127, so the
/// i16 pair sums stay below 2·127·127 < 32768.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
    dot_u8i8(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
}

/// `acc` + the pairwise i16 products of `p` and `s`, summed into i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd16_acc(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
}

x86_kernels!(
    features = "avx2,fma,f16c",
    isa = crate::dispatch::Isa::Avx2,
    tile32 = 4 x 2,
    kernel32 = tile32: W32,
    tilek = 2 x 2,
    packed = Some(|w, panels, act, n, g, out| {
        // SAFETY: see KERNELS.
        unsafe { crate::arch::packed256::panel(w, panels, act, n, g, out) }
    }),
    packed_f = Some(|w, panels, x, n, out| {
        // SAFETY: see KERNELS.
        unsafe { crate::arch::packed256::panel_f(w, panels, x, n, out) }
    }),
    packed_formats = &crate::packed::PackedFormat::ALL,
    attention = [dot_cols_f32, dot_cols_f16, axpy_rows_f32, axpy_rows_f16, f16_to_f32],
    quantize32 = quantize32,
    task_rows = crate::arch::packed256::ACT_CHUNK
);

/// [`crate::dispatch::quantize_row32`] with 256-bit vectors, producing the same bytes as the portable
/// code: same products, no fused multiply-adds, and rounding to nearest-even like its magic-number trick.
#[target_feature(enable = "avx2,fma,f16c")]
fn quantize32(x: &[f32], group: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32], isum: &mut [i32]) {
    assert!(group == 1 || group == 2);
    let cols = x.len();
    let nb = cols / 32;
    assert!(cols.is_multiple_of(32) && qs.len() == group * cols && d.len() == group * nb);
    assert!(s.len() == group * nb && isum.len() == group * nb);
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    // Rounds, clamps to ±127 and narrows 4×8 floats to 32 bytes in order; returns them, their sum and the
    // rounded values as floats.
    let quant = |v: [__m256; 4], id: f32| -> (__m256i, i32, [__m256; 4]) {
        let idv = _mm256_set1_ps(id);
        let rf: [__m256; 4] = std::array::from_fn(|k| {
            let r = _mm256_round_ps(_mm256_mul_ps(v[k], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_min_ps(_mm256_max_ps(r, lo), hi)
        });
        let q: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(rf[k]));
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1));
        // i32 → i16 → i8 packs interleave 128-bit lanes; the final permute restores element order.
        let p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        (_mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)), _mm_cvtsi128_si32(s1), rf)
    };
    let store = |dst: &mut [i8], v: __m256i| {
        let dst = &mut dst[..32];
        // SAFETY: the slice above has 32 bytes; no alignment requirement.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
    };
    // The scales of a whole run of blocks first, then its quantization (see `QUANT_RUN`).
    for run in block_runs(nb) {
        let mut scale = [(0f32, 0f32); QUANT_RUN];
        for (sc, b) in scale.iter_mut().zip(run.clone()) {
            let v: [__m256; 4] = std::array::from_fn(|k| ld8f(x, b * 32 + 8 * k));
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            *sc = block_scale(_mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2))));
        }
        for (&(d1, id1), b) in scale.iter().zip(run) {
            let v: [__m256; 4] = std::array::from_fn(|k| ld8f(x, b * 32 + 8 * k));
            let (q1, sum1, r1) = quant(v, id1);
            store(&mut qs[b * 32..], q1);
            let residual = if group == 2 {
                let (d2, id2) = residual_scale(d1, id1);
                // Residual x − d1·q1 (a product, then a difference: no fused multiply-add, as in the portable
                // code).
                let d1v = _mm256_set1_ps(d1);
                let res: [__m256; 4] = std::array::from_fn(|k| _mm256_sub_ps(v[k], _mm256_mul_ps(d1v, r1[k])));
                let (q2, sum2, _) = quant(res, id2);
                store(&mut qs[cols + b * 32..], q2);
                Some((d2, sum2))
            } else {
                None
            };
            put_block((&mut *d, &mut *s, &mut *isum), nb, b, (d1, sum1), residual);
        }
    }
}
