//! The 32-weight formats in their GGUF layout (Q8_0, Q4_0, Q4_1, Q5_0) against [`crate::dispatch::Act32`]: the
//! kernels for matrices that are not repacked into panels (see [`crate::packed`]).

macro_rules! x86_blocks32 {
    ($feat:literal, tile = $R32:literal x $C32:literal, kernel = $tile32:ident: $W32b:ident) => {
        // ---------------------------------------------------------------------------------------------------
        // 32-weight blocks (Q8_0, Q4_0, Q4_1, Q5_0) against Act32. Each weight block is unpacked to 32 unsigned
        // bytes `u` with `w = d·(u − OFF)` (+ m for Q4_1); per (row, activation) and block the kernel forms
        // Σ u·q − OFF·Σq exactly in i32 lanes (the −OFF·Σq seeded into lane 0), converts once and scales by d·d_a.

        trait W32: Copy {
            const OFF: i32;
            const HAS_MIN: bool;
            /// # Safety
            /// The CPU must have this level's features.
            unsafe fn unpack(&self) -> __m256i;
            /// `acc` + Σ u·q per i32 lane.
            ///
            /// # Safety
            /// As `unpack`.
            unsafe fn dot(acc: __m256i, u: __m256i, q: __m256i) -> __m256i;
            fn d(&self) -> f16;
            fn m(&self) -> f16 {
                f16::ZERO
            }
        }

        /// The 16 packed bytes of a 4-bit block as 32 nibbles in weight order: low nibbles are weights 0..16,
        /// high nibbles weights 16..32.
        #[inline]
        #[target_feature(enable = $feat)]
        fn nibbles(qs: &[u8; 16]) -> __m256i {
            let v = ld16b(qs);
            let lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
            _mm256_set_m128i(hi, lo)
        }

        impl W32 for BlockQ4_0 {
            const OFF: i32 = 8;
            const HAS_MIN: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack(&self) -> __m256i {
                nibbles(&self.qs)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot(acc: __m256i, u: __m256i, q: __m256i) -> __m256i {
                dot_u8i8(acc, u, q)
            }
            fn d(&self) -> f16 {
                self.d
            }
        }

        impl W32 for BlockQ4_1 {
            const OFF: i32 = 0;
            const HAS_MIN: bool = true;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack(&self) -> __m256i {
                nibbles(&self.qs)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot(acc: __m256i, u: __m256i, q: __m256i) -> __m256i {
                dot_u8i8(acc, u, q)
            }
            fn d(&self) -> f16 {
                self.d
            }
            fn m(&self) -> f16 {
                self.m
            }
        }

        impl W32 for BlockQ5_0 {
            const OFF: i32 = 16;
            const HAS_MIN: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack(&self) -> __m256i {
                // Bit i of qh → 0x10 in byte i: byte i takes qh byte i/8, tests bit i%8, and the all-ones
                // compare result is masked down to 0x10.
                let qh = _mm256_set1_epi32(u32::from_le_bytes(self.qh) as i32);
                let spread = _mm256_shuffle_epi8(
                    qh,
                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
                );
                let bits = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
                let hit = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
                _mm256_or_si256(nibbles(&self.qs), _mm256_and_si256(hit, _mm256_set1_epi8(0x10)))
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot(acc: __m256i, u: __m256i, q: __m256i) -> __m256i {
                dot_u8i8(acc, u, q)
            }
            fn d(&self) -> f16 {
                self.d
            }
        }

        impl W32 for BlockQ8_0 {
            const OFF: i32 = Q8_0_OFF;
            const HAS_MIN: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn unpack(&self) -> __m256i {
                ld32(&self.qs)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
                dot_q8_0(acc, w, q)
            }
            fn d(&self) -> f16 {
                self.d
            }
        }

        /// One tile: weight rows `w` × output rows `o0..o0 + C`. With `G == 2` each output row has two activation
        /// rows, high part `q1` and residual `q2` with `d2 = d1 / 256` (see [`Act32`]): the kernel forms
        /// `256·Σ(u − OFF)·q1 + Σ(u − OFF)·q2` in the integers and scales it once by `d·d2`.
        #[allow(dead_code)]
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tile32<B: W32, const R: usize, const C: usize, const G: usize>(
            w: [&[B]; R],
            act: Act32<'_>,
            o0: usize,
            nb: usize,
        ) -> [[f32; C]; R] {
            // SAFETY: the caller has this level's features.
            unsafe { tile32_blocks::<B, R, C, G>(w, act, o0, nb, 0..nb) }
        }

        /// The blocks `blocks` of a tile (rows of `nb` blocks).
        #[allow(dead_code)]
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tile32_blocks<B: W32, const R: usize, const C: usize, const G: usize>(
            w: [&[B]; R],
            act: Act32<'_>,
            o0: usize,
            nb: usize,
            blocks: Range<usize>,
        ) -> [[f32; C]; R] {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut macc = [[0f32; C]; R];
            for b in blocks {
                let mut u = [_mm256_setzero_si256(); R];
                let mut wd = [0f32; R];
                let mut wm = [0f32; R];
                for r in 0..R {
                    // Prefetch hint 128 blocks ahead (2.5-4 KB, about DRAM latency × bandwidth; measured best of
                    // 16/64/128): decode streams the weights from DRAM once. A hint cannot fault past the row, and
                    // `wrapping_add` keeps the address computation defined.
                    _mm_prefetch::<_MM_HINT_T0>(w[r].as_ptr().wrapping_add(b + 128).cast());
                }
                for r in 0..R {
                    let blk = &w[r][b];
                    // SAFETY: the caller has this level's features.
                    u[r] = unsafe { blk.unpack() };
                    wd[r] = h2f(blk.d());
                    if B::HAS_MIN {
                        wm[r] = h2f(blk.m());
                    }
                }
                for c in 0..C {
                    let a = (o0 + c) * G;
                    let (q, ad, s, isum) = act.block(a, nb, b);
                    let qv = ld32(q);
                    // −OFF·Σq in lane 0, zeros elsewhere: the lanes then sum to Σ (u − OFF)·q exactly.
                    let seed = _mm256_castsi128_si256(_mm_cvtsi32_si128(-B::OFF * isum));
                    let (mut qv2, mut seed2, mut scale) = (_mm256_setzero_si256(), _mm256_setzero_si256(), ad);
                    if G == 2 {
                        let (q2, ad2, _, isum2) = act.block(a + 1, nb, b);
                        (qv2, seed2, scale) =
                            (ld32(q2), _mm256_castsi128_si256(_mm_cvtsi32_si128(-B::OFF * isum2)), ad2);
                    }
                    for r in 0..R {
                        // SAFETY (both): the caller has this level's features.
                        let mut iv = unsafe { B::dot(seed, u[r], qv) };
                        if G == 2 {
                            iv = _mm256_add_epi32(_mm256_slli_epi32(iv, 8), unsafe { B::dot(seed2, u[r], qv2) });
                        }
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv), _mm256_set1_ps(wd[r] * scale), acc[r][c]);
                        if B::HAS_MIN {
                            macc[r][c] += wm[r] * s;
                        }
                    }
                }
            }
            let mut res = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    res[r][c] = hsum(acc[r][c]) + macc[r][c];
                }
            }
            res
        }

        /// Writes a tile's results, summing each group of `group` activation rows into one output row.
        #[inline]
        fn emit<const R: usize, const C: usize>(
            res: &[[f32; C]; R],
            r0: usize,
            a0: usize,
            group: usize,
            out: &OutSink<'_>,
        ) {
            for r in 0..R {
                let mut c = 0;
                while c < C {
                    let mut v = res[r][c];
                    for g in 1..group {
                        v += res[r][c + g];
                    }
                    out.put((a0 + c) / group, r0 + r, v);
                    c += group;
                }
            }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows32<B: $W32b, const R: usize, const G: usize>(
            w: &[B],
            nb: usize,
            r0: usize,
            act: Act32<'_>,
            outs: Range<usize>,
            out: &OutSink<'_>,
        ) {
            let wr: [&[B]; R] = std::array::from_fn(|i| &w[(r0 + i) * nb..(r0 + i + 1) * nb]);
            let mut i = outs.start;
            macro_rules! go {
                ($c:expr) => {{
                    // SAFETY: the caller has this level's features.
                    let res = unsafe { $tile32::<B, R, { $c }, G>(wr, act, i, nb) };
                    for r in 0..R {
                        for c in 0..$c {
                            out.put(i + c, r0 + r, res[r][c]);
                        }
                    }
                    i += $c;
                }};
            }
            while i < outs.end {
                let left = outs.end - i;
                if left >= $C32 {
                    go!($C32)
                } else if left >= 2 {
                    go!(2)
                } else {
                    go!(1)
                }
            }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn panel32_g<B: $W32b, const G: usize>(
            w: &[B],
            nb: usize,
            rows: Range<usize>,
            act: Act32<'_>,
            n_out: usize,
            out: &OutSink<'_>,
        ) {
            // Output rows in chunks whose activations stay in L1/L2 while every weight row of the panel passes.
            let ach = 64 / G;
            let mut o0 = 0;
            while o0 < n_out {
                let o1 = (o0 + ach).min(n_out);
                let mut r = rows.start;
                while r < rows.end {
                    // SAFETY (both): the caller has this level's features.
                    if rows.end - r >= $R32 {
                        unsafe { rows32::<B, $R32, G>(w, nb, r, act, o0..o1, out) };
                        r += $R32;
                    } else {
                        unsafe { rows32::<B, 1, G>(w, nb, r, act, o0..o1, out) };
                        r += 1;
                    }
                }
                o0 = o1;
            }
        }

        /// # Safety
        /// The CPU must have this level's features.
        #[target_feature(enable = $feat)]
        unsafe fn panel32<B: $W32b>(
            w: &[B],
            nb: usize,
            rows: Range<usize>,
            act: Act32<'_>,
            n_act: usize,
            group: usize,
            out: &OutSink<'_>,
        ) {
            assert!(group == 1 || group == 2);
            assert!(n_act % group == 0 && rows.end * nb <= w.len() && act.qs.len() >= n_act * nb * 32);
            // SAFETY (both): the caller has this level's features.
            if group == 1 {
                unsafe { panel32_g::<B, 1>(w, nb, rows, act, n_act, out) }
            } else {
                unsafe { panel32_g::<B, 2>(w, nb, rows, act, n_act / 2, out) }
            }
        }
    };
}
