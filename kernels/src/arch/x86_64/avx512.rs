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
    kernel32 = tile32z: W32Z,
    tilek = 2 x 4,
    packed = Some(|w, panels, act, n, g, out| {
        // SAFETY: see KERNELS.
        unsafe { crate::arch::packed512::panel(w, panels, act, n, g, out) }
    })
);

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

/// (s[i] ×8, s[i + 1] ×8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f2_pair(s: &[f32], i: usize) -> __m512 {
    let p = &s[i..i + 2];
    // SAFETY: the slice above holds two f32 = 8 readable bytes.
    let v = unsafe { _mm_loadl_epi64(p.as_ptr().cast()) };
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castsi128_ps(v)))
}

/// (v[i] in lane 0, v[i + 1] in lane 8, zeros elsewhere), times `k`.
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
