//! f32 vector helpers (dot, axpy, scale) and F32/F16 weight matrices against f32 activations.

macro_rules! x86_float {
    ($feat:literal) => {
        // ---------------------------------------------------------------------------------------------------
        // f32 helpers (attention). Four accumulators over 32-element steps, then 8-element steps, then a scalar
        // tail; the order is fixed, so results are deterministic.

        /// Σ a·b with `b` in f32 or f16 (`W`).
        ///
        /// # Safety
        /// The CPU must have this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn dot<W: WF>(a: &[f32], b: &[W]) -> f32 {
            assert_eq!(a.len(), b.len());
            let n = a.len();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            // SAFETY (all `ld`/`get`): the caller has this level's features; they check their bounds.
            while i + 32 <= n {
                for k in 0..4 {
                    acc[k] = _mm256_fmadd_ps(ld8f(a, i + 8 * k), unsafe { W::ld(b, i + 8 * k) }, acc[k]);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(ld8f(a, i), unsafe { W::ld(b, i) }, acc[0]);
                i += 8;
            }
            let mut s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
            while i < n {
                s += a[i] * unsafe { W::get(b, i) };
                i += 1;
            }
            s
        }

        #[target_feature(enable = $feat)]
        fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            // SAFETY: this function has the level's features.
            unsafe { dot(a, b) }
        }

        #[target_feature(enable = $feat)]
        fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
            // SAFETY: this function has the level's features.
            unsafe { dot(a, b) }
        }

        /// y += alpha·x with `x` in f32 or f16 (`W`).
        ///
        /// # Safety
        /// The CPU must have this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn axpy<W: WF>(alpha: f32, x: &[W], y: &mut [f32]) {
            assert_eq!(x.len(), y.len());
            let n = x.len();
            let av = _mm256_set1_ps(alpha);
            let mut i = 0;
            // SAFETY (all `ld`/`get`): as in `dot`.
            while i + 8 <= n {
                st8f(y, i, _mm256_fmadd_ps(av, unsafe { W::ld(x, i) }, ld8f(y, i)));
                i += 8;
            }
            while i < n {
                y[i] = alpha.mul_add(unsafe { W::get(x, i) }, y[i]);
                i += 1;
            }
        }

        #[target_feature(enable = $feat)]
        fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { axpy(alpha, x, y) }
        }

        #[target_feature(enable = $feat)]
        fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { axpy(alpha, x, y) }
        }

        #[target_feature(enable = $feat)]
        fn scale_f32(alpha: f32, y: &mut [f32]) {
            let n = y.len();
            let av = _mm256_set1_ps(alpha);
            let mut i = 0;
            while i + 8 <= n {
                st8f(y, i, _mm256_mul_ps(av, ld8f(y, i)));
                i += 8;
            }
            while i < n {
                y[i] *= alpha;
                i += 1;
            }
        }

        // ---------------------------------------------------------------------------------------------------
        // F32 / F16 weights against f32 activations: R weight rows × C activation rows per tile.

        trait WF: Copy {
            /// Eight weights from `s[i..i + 8]` as f32.
            ///
            /// # Safety
            /// The CPU must have this level's features.
            unsafe fn ld(s: &[Self], i: usize) -> __m256;
            /// # Safety
            /// As `ld`.
            unsafe fn get(s: &[Self], i: usize) -> f32;
            /// Eight weights from `p..p + 8` as f32, unchecked.
            ///
            /// # Safety
            /// Eight elements must be readable at `p`; the CPU must have this level's features.
            unsafe fn ldp(p: *const Self) -> __m256;
            /// Whether `ld`/`ldp` convert (f16): each load then costs an instruction that is slow on some cores,
            /// so tiles that share one load among more rows pay off (see `dot_cols`).
            const CONVERTS: bool;
        }
        impl WF for f32 {
            const CONVERTS: bool = false;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn ld(s: &[f32], i: usize) -> __m256 {
                ld8f(s, i)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn get(s: &[f32], i: usize) -> f32 {
                s[i]
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn ldp(p: *const f32) -> __m256 {
                // SAFETY: the caller guarantees eight readable values; no alignment requirement.
                unsafe { _mm256_loadu_ps(p) }
            }
        }
        impl WF for f16 {
            const CONVERTS: bool = true;
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn ld(s: &[f16], i: usize) -> __m256 {
                ld8h(s, i)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn get(s: &[f16], i: usize) -> f32 {
                h2f(s[i])
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn ldp(p: *const f16) -> __m256 {
                // SAFETY: the caller guarantees eight readable values (16 bytes); no alignment requirement.
                _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
            }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tile_f<W: WF, const R: usize, const C: usize>(w: [&[W]; R], x: [&[f32]; C]) -> [[f32; C]; R] {
            let n = x[0].len();
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut k = 0;
            while k + 8 <= n {
                let mut wv = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    // SAFETY: the caller has this level's features.
                    wv[r] = unsafe { W::ld(w[r], k) };
                }
                for c in 0..C {
                    let xv = ld8f(x[c], k);
                    for r in 0..R {
                        acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
                    }
                }
                k += 8;
            }
            let mut res = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    let mut s = hsum(acc[r][c]);
                    for t in k..n {
                        // SAFETY: the caller has this level's features.
                        s += unsafe { W::get(w[r], t) } * x[c][t];
                    }
                    res[r][c] = s;
                }
            }
            res
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows_f<W: WF, const R: usize>(
            w: &[W],
            cols: usize,
            r0: usize,
            x: &[f32],
            a: Range<usize>,
            out: &OutSink<'_>,
        ) {
            let wr: [&[W]; R] = std::array::from_fn(|i| &w[(r0 + i) * cols..(r0 + i + 1) * cols]);
            let mut i = a.start;
            macro_rules! go {
                ($c:expr) => {{
                    let xs: [&[f32]; $c] = std::array::from_fn(|c| &x[(i + c) * cols..(i + c + 1) * cols]);
                    // SAFETY: the caller has this level's features.
                    let res = unsafe { tile_f::<W, R, $c>(wr, xs) };
                    for r in 0..R {
                        for c in 0..$c {
                            out.put(i + c, r0 + r, res[r][c]);
                        }
                    }
                    i += $c;
                }};
            }
            // Tiles of 4 weight rows × 2 activation rows: 8 accumulators, the 4 rows' weights and an activation
            // vector fit the 16 registers (4 × 3 spilled, at about 60% of this rate).
            while i < a.end {
                match a.end - i {
                    1 => go!(1),
                    _ => go!(2),
                }
            }
        }

        /// # Safety
        /// The CPU must have this level's features.
        #[target_feature(enable = $feat)]
        unsafe fn panel_f<W: WF>(w: &[W], cols: usize, rows: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
            const ACH: usize = 48;
            let mut a0 = 0;
            while a0 < n_act {
                let a1 = (a0 + ACH).min(n_act);
                let mut r = rows.start;
                while r < rows.end {
                    // SAFETY (both): the caller has this level's features.
                    if rows.end - r >= 4 {
                        unsafe { rows_f::<W, 4>(w, cols, r, x, a0..a1, out) };
                        r += 4;
                    } else {
                        unsafe { rows_f::<W, 1>(w, cols, r, x, a0..a1, out) };
                        r += 1;
                    }
                }
                a0 = a1;
            }
        }
    };
}
