//! K-quant super-blocks in their GGUF layout (Q2_K, Q4_K, Q6_K) against Q8_K activations, and the Q8_K
//! quantizer compiled for the level.

macro_rules! x86_kquants {
    ($feat:literal, tile = $RK:literal x $CK:literal) => {
        /// As `quantize32`, for Q8_K.
        #[target_feature(enable = $feat)]
        fn quantize_k(x: &[f32], group: usize, out: &mut [BlockQ8K]) {
            crate::matmul::quantize_row_k_impl(x, group, out)
        }

        // ---------------------------------------------------------------------------------------------------
        // K-quant super-blocks against Q8_K. `prep` unpacks a super-block into eight 32-weight groups of unsigned
        // bytes `u[g]` plus, for each group, i16 scales aligned with the 16 pair-sums of `maddubs(u, q)`
        // (lanes 0..8 = first 16 weights, 8..16 = last 16). `mv` holds one i16 coefficient per 16-weight
        // sub-block for the bsums term: Q4_K/Q2_K's mins (scaled by dmin, in float), or Q6_K's 32·sc which is
        // subtracted in the integers (the −32 offset).

        trait WK: Copy {
            const INT_OFFSET: bool;
            /// Returns (mv, d, dmin).
            ///
            /// # Safety
            /// The CPU must have this level's features.
            unsafe fn prep(&self, u: &mut [__m256i; 8], sc: &mut [__m256i; 8]) -> (__m256i, f32, f32);
        }

        impl WK for BlockQ4K {
            const INT_OFFSET: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn prep(&self, u: &mut [__m256i; 8], sc: &mut [__m256i; 8]) -> (__m256i, f32, f32) {
                // The 12 scale bytes as three little-endian words: scales and mins of sub-blocks 0..4 are the low six
                // bits of words 0 and 1; those of sub-blocks 4..8 take their low four bits from word 2 (scale low
                // nibble, min high nibble) and their top two from the spare top bits of words 0 and 1.
                let w = |i: usize| u32::from_le_bytes(self.scales[4 * i..4 * i + 4].try_into().unwrap());
                let (w0, w1, w2) = (w(0), w(1), w(2));
                let sc_lo = w0 & 0x3F3F_3F3F;
                let m_lo = w1 & 0x3F3F_3F3F;
                let sc_hi = (w2 & 0x0F0F_0F0F) | (((w0 >> 6) & 0x0303_0303) << 4);
                let m_hi = ((w2 >> 4) & 0x0F0F_0F0F) | (((w1 >> 6) & 0x0303_0303) << 4);
                let sc8 = _mm_cvtsi64_si128((sc_lo as u64 | (sc_hi as u64) << 32) as i64);
                let m8 = _mm_cvtsi64_si128((m_lo as u64 | (m_hi as u64) << 32) as i64);
                let qs: &[[u8; 32]; 4] = self.qs.as_chunks::<32>().0.try_into().unwrap();
                for c in 0..4 {
                    // Chunk c: low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1.
                    let v = ld32(&qs[c]);
                    u[2 * c] = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                    u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
                }
                // Scale j as i16 in every lane: widen the 8 bytes, copy to both halves, pick word j.
                let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
                for j in 0..8 {
                    sc[j] = _mm256_shuffle_epi8(scv, _mm256_set1_epi16(((2 * j + 1) << 8 | 2 * j) as i16));
                }
                // Each min twice, once per 16-weight bsum of its 32-weight sub-block.
                let m16 = _mm_cvtepu8_epi16(m8);
                let mv = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
                (mv, h2f(self.d), h2f(self.dmin))
            }
        }

        /// For 16 i16 sub-block scales `s16`, the eight 32-weight groups' scale vectors: group g is sub-blocks 2g
        /// (lanes 0..8, the first 16 weights) and 2g + 1 (lanes 8..16).
        #[inline]
        #[target_feature(enable = $feat)]
        fn pair_scales(s16: __m256i, sc: &mut [__m256i; 8]) {
            let halves = [_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1)];
            for h in 0..2 {
                // Both 128-bit lanes hold scales 8h..8h+8; each lane then picks its word.
                let v = _mm256_broadcastsi128_si256(halves[h]);
                for k in 0..4 {
                    let (lo, hi) = (2 * (2 * k) as i16, 2 * (2 * k + 1) as i16);
                    let mask = _mm256_set_m128i(_mm_set1_epi16((hi + 1) << 8 | hi), _mm_set1_epi16((lo + 1) << 8 | lo));
                    sc[4 * h + k] = _mm256_shuffle_epi8(v, mask);
                }
            }
        }

        impl WK for BlockQ6K {
            const INT_OFFSET: bool = true;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn prep(&self, u: &mut [__m256i; 8], sc: &mut [__m256i; 8]) -> (__m256i, f32, f32) {
                let ql: &[[u8; 32]; 4] = self.ql.as_chunks::<32>().0.try_into().unwrap();
                let qh: &[[u8; 32]; 2] = self.qh.as_chunks::<32>().0.try_into().unwrap();
                let m4 = _mm256_set1_epi8(0x0F);
                let m2 = _mm256_set1_epi8(0x30);
                for n in 0..2 {
                    let l0 = ld32(&ql[2 * n]);
                    let l1 = ld32(&ql[2 * n + 1]);
                    let h = ld32(&qh[n]);
                    // Group 4n + k: low four bits from l0/l1 (low or high nibble), bits 4..5 from bit pair k of h,
                    // moved to 0x30.
                    u[4 * n] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
                    u[4 * n + 1] =
                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
                    u[4 * n + 2] =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
                    u[4 * n + 3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(h, 2), m2),
                    );
                }
                // SAFETY: 16 readable bytes.
                let s8 = unsafe { _mm_loadu_si128(self.scales.as_ptr().cast()) };
                let s16 = _mm256_cvtepi8_epi16(s8);
                pair_scales(s16, sc);
                // 32·sc per 16-weight sub-block, for Σ sc·(q − 32)·a = Σ sc·q·a − Σ 32·sc·bsum.
                (_mm256_slli_epi16(s16, 5), h2f(self.d), 0.0)
            }
        }

        impl WK for BlockQ2K {
            const INT_OFFSET: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn prep(&self, u: &mut [__m256i; 8], sc: &mut [__m256i; 8]) -> (__m256i, f32, f32) {
                let qs: &[[u8; 32]; 2] = self.qs.as_chunks::<32>().0.try_into().unwrap();
                let m3 = _mm256_set1_epi8(3);
                for n in 0..2 {
                    let v = ld32(&qs[n]);
                    // Group 4n + s is bit pair 2s of every byte.
                    u[4 * n] = _mm256_and_si256(v, m3);
                    u[4 * n + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
                    u[4 * n + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
                    u[4 * n + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
                }
                // Scale in the low nibble, min in the high nibble of each byte.
                let s16 = _mm256_cvtepu8_epi16(ld16b(&self.scales));
                pair_scales(_mm256_and_si256(s16, _mm256_set1_epi16(0x0F)), sc);
                (_mm256_srli_epi16(s16, 4), h2f(self.d), h2f(self.dmin))
            }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tilek<B: WK, const R: usize, const C: usize>(
            w: [&[B]; R],
            act: &[BlockQ8K],
            a0: usize,
            nb: usize,
        ) -> [[f32; C]; R] {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for b in 0..nb {
                let mut u = [[_mm256_setzero_si256(); 8]; R];
                let mut sc = [[_mm256_setzero_si256(); 8]; R];
                let mut mv = [_mm256_setzero_si256(); R];
                let mut d = [0f32; R];
                let mut dmin = [0f32; R];
                for r in 0..R {
                    // Prefetch hint 8 super-blocks ahead (one line; the hardware prefetcher follows), as for the
                    // 32-blocks.
                    _mm_prefetch::<_MM_HINT_T0>(w[r].as_ptr().wrapping_add(b + 8).cast());
                    // SAFETY: the caller has this level's features.
                    (mv[r], d[r], dmin[r]) = unsafe { w[r][b].prep(&mut u[r], &mut sc[r]) };
                }
                for c in 0..C {
                    let ab = &act[(a0 + c) * nb + b];
                    let qs: &[[i8; 32]; 8] = ab.qs.as_chunks::<32>().0.try_into().unwrap();
                    // SAFETY: 16 i16 = 32 readable bytes.
                    let bs = unsafe { _mm256_loadu_si256(ab.bsums.as_ptr().cast()) };
                    let mut iv = [_mm256_setzero_si256(); R];
                    for g in 0..8 {
                        let q = ld32(&qs[g]);
                        for r in 0..R {
                            iv[r] = madd16_acc(iv[r], _mm256_maddubs_epi16(u[r][g], q), sc[r][g]);
                        }
                    }
                    for r in 0..R {
                        let mt = _mm256_madd_epi16(bs, mv[r]);
                        if B::INT_OFFSET {
                            let t = _mm256_sub_epi32(iv[r], mt);
                            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d[r] * ab.d), acc[r][c]);
                        } else {
                            acc[r][c] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv[r]), _mm256_set1_ps(d[r] * ab.d), acc[r][c]);
                            acc[r][c] =
                                _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mt), _mm256_set1_ps(dmin[r] * ab.d), acc[r][c]);
                        }
                    }
                }
            }
            let mut res = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    res[r][c] = hsum(acc[r][c]);
                }
            }
            res
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rowsk<B: WK, const R: usize>(
            w: &[B],
            nb: usize,
            r0: usize,
            act: &[BlockQ8K],
            a: Range<usize>,
            group: usize,
            out: &OutSink<'_>,
        ) {
            let wr: [&[B]; R] = std::array::from_fn(|i| &w[(r0 + i) * nb..(r0 + i + 1) * nb]);
            let mut i = a.start;
            macro_rules! go {
                ($c:expr) => {{
                    // SAFETY: the caller has this level's features.
                    let res = unsafe { tilek::<B, R, { $c }>(wr, act, i, nb) };
                    emit(&res, r0, i, group, out);
                    i += $c;
                }};
            }
            while i < a.end {
                let left = a.end - i;
                if left >= $CK {
                    go!($CK)
                } else if left >= 2 {
                    go!(2)
                } else {
                    go!(1)
                }
            }
        }

        /// # Safety
        /// The CPU must have this level's features.
        #[target_feature(enable = $feat)]
        unsafe fn panelk<B: WK>(
            w: &[B],
            nb: usize,
            rows: Range<usize>,
            act: &[BlockQ8K],
            n_act: usize,
            group: usize,
            out: &OutSink<'_>,
        ) {
            assert!(group == 1 || group == 2);
            assert!(n_act % group == 0 && rows.end * nb <= w.len() && act.len() >= n_act * nb);
            const ACH: usize = 32;
            let mut a0 = 0;
            while a0 < n_act {
                let a1 = (a0 + ACH).min(n_act);
                let mut r = rows.start;
                while r < rows.end {
                    // SAFETY (both): the caller has this level's features.
                    if rows.end - r >= $RK {
                        unsafe { rowsk::<B, $RK>(w, nb, r, act, a0..a1, group, out) };
                        r += $RK;
                    } else {
                        unsafe { rowsk::<B, 1>(w, nb, r, act, a0..a1, group, out) };
                        r += 1;
                    }
                }
                a0 = a1;
            }
        }
    };
}
