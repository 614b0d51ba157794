//! AVX-512 (F, BW, VL, VNNI) kernels: the same loops as AVX2, with the 8-bit dot product done by one VNNI
//! instruction (`vpdpbusd`: four u8×i8 products summed straight into each i32 lane, no 16-bit saturation), so
//! Q8_0 weights can simply be biased to unsigned (w + 128) and the bias removed through Σq.

use std::arch::x86_64::*;

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
    tilek = 2 x 4
);
