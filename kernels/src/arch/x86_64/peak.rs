//! The x86-64 loops of [`crate::peak`]: independent chains of the one instruction each level's matrix kernels are
//! built on, with nothing else in the loop, so that their rate is the most the kernels could reach.

use std::arch::x86_64::*;

/// Independent accumulator chains: enough to cover latency × issue width on the cores this runs on (FMA: 4 cycles
/// × 2 pipes on Zen 4/5 and recent Intel; `vpdpbusd`/`vpmaddwd`: 3–5 cycles × 2 pipes), and few enough to stay in
/// the 16 registers of AVX2.
pub(crate) const CHAINS: usize = 12;

/// `rounds × CHAINS` 256-bit FMAs (8 lanes each); returns a value that depends on all of them.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn fma256(rounds: usize, x: f32, y: f32) -> f32 {
    let (x, y) = (_mm256_set1_ps(x), _mm256_set1_ps(y));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, x, y);
        }
    }
    acc.iter().map(|a| _mm256_cvtss_f32(*a)).sum()
}

/// `rounds × CHAINS` 512-bit FMAs (16 lanes each).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn fma512(rounds: usize, x: f32, y: f32) -> f32 {
    let (x, y) = (_mm512_set1_ps(x), _mm512_set1_ps(y));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    acc.iter().map(|a| _mm512_reduce_add_ps(*a)).sum()
}

/// `rounds × CHAINS` 256-bit `vpmaddwd` (16 products of 16-bit pairs each), the multiply of the AVX2 integer
/// kernels. Each chain feeds its own result back as the next left operand, so the loop cannot be hoisted.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn madd256(rounds: usize, y: i32) -> i32 {
    let y = _mm256_set1_epi32(y);
    let mut acc: [__m256i; CHAINS] = std::array::from_fn(|i| _mm256_set1_epi32(i as i32 + 1));
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm256_madd_epi16(*a, y);
        }
    }
    acc.iter().fold(0i32, |s, a| s.wrapping_add(_mm256_extract_epi32::<0>(*a)))
}

/// `rounds × CHAINS` 512-bit `vpdpbusd` (64 products of 8-bit values each), the multiply of the AVX-512 integer
/// kernels.
///
/// # Safety
/// The CPU must have AVX-512 F and VNNI.
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpbusd512(rounds: usize, x: i32, y: i32) -> i32 {
    let (x, y) = (_mm512_set1_epi32(x), _mm512_set1_epi32(y));
    let mut acc: [__m512i; CHAINS] = std::array::from_fn(|i| _mm512_set1_epi32(i as i32));
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm512_dpbusd_epi32(*a, x, y);
        }
    }
    acc.iter().fold(0i32, |s, a| s.wrapping_add(_mm512_reduce_add_epi32(*a)))
}
