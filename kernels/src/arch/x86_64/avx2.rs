//! AVX2 + FMA + F16C kernels (any x86-64 from 2013 on). 8-bit products go through `maddubs` (u8×i8 → pairs
//! summed in i16) and `madd` (i16 pairs → i32); that is exact as long as the unsigned weight is at most 127, so
//! signed Q8_0 weights move their sign onto the activation instead of being biased by 128.

use std::arch::x86_64::*;

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
    packed = None,
    attention = [dot_cols_f32, dot_cols_f16, axpy_rows_f32, axpy_rows_f16]
);
