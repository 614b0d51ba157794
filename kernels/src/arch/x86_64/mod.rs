//! The x86-64 kernels, written once and instantiated per instruction-set level.
//!
//! [`x86_kernels!`] expands to a whole set of kernels compiled with one `#[target_feature]` string; the module that
//! invokes it supplies the few primitives that differ between levels (the 8-bit dot product, the 16-bit
//! multiply-accumulate, the Q8_0 weight trick). All loops work on 256-bit vectors: one 32-weight block, or one
//! 32-weight group of a K-quant super-block, per register.
//!
//! The primitives each level must define (all `#[target_feature]` safe fns over `__m256i`):
//! - `dot_u8i8(acc, u, q)`: each i32 lane of `acc` plus the four products `u·q` of its bytes (u unsigned, q signed,
//!   |u| ≤ 31 on the AVX2 path so the 16-bit pair sums cannot saturate);
//! - `dot_q8_0(acc, w, q)` and `Q8_0_OFF`: the same for signed Q8_0 weights `w`; the kernel subtracts
//!   `Q8_0_OFF · Σq` (128 when `w` is biased to unsigned, 0 when the sign is moved onto `q`);
//! - `madd16_acc(acc, p, s)`: `acc` plus the pairwise products of the i16 lanes of `p` and `s`.
//!
//! `quantize32 = ..` names the level's activation quantizer (the macro's 256-bit `quantize32`, or a wider one).
//! `attention = [..]` names the level's four attention kernels (`dot_cols` and `axpy_rows`, f32 and f16 caches):
//! the 256-bit ones the macro defines, or wider ones of the level's own that fall back on them.

macro_rules! x86_kernels {
    (
        features = $feat:literal,
        isa = $isa:expr,
        tile32 = $R32:literal x $C32:literal,
        kernel32 = $tile32:ident: $W32b:ident,
        tilek = $RK:literal x $CK:literal,
        packed = $packed:expr,
        packed_formats = $pf:expr,
        attention = [$dc32:ident, $dc16:ident, $ar32:ident, $ar16:ident],
        quantize32 = $q32:ident
    ) => {
        use std::ops::Range;

        use half::f16;

        use crate::dispatch::{Act32, Kernels, OutSink};
        use crate::quant::{BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8K};
        use crate::vec_f32::AxpyRows;

        /// This level's table. Only [`crate::dispatch`] hands it out, after checking the CPU has every feature in
        /// the target-feature string: that check is the safety argument of every wrapper below.
        pub(crate) static KERNELS: Kernels = Kernels {
            isa: $isa,
            dot_f32: |a, b| {
                // SAFETY: see KERNELS.
                unsafe { dot_f32(a, b) }
            },
            axpy_f32: |alpha, x, y| {
                // SAFETY: see KERNELS.
                unsafe { axpy_f32(alpha, x, y) }
            },
            scale_f32: |alpha, y| {
                // SAFETY: see KERNELS.
                unsafe { scale_f32(alpha, y) }
            },
            dot_f16: |a, b| {
                // SAFETY: see KERNELS.
                unsafe { dot_f16(a, b) }
            },
            axpy_f16: |alpha, x, y| {
                // SAFETY: see KERNELS.
                unsafe { axpy_f16(alpha, x, y) }
            },
            f32: |w, cols, rows, x, n, out| {
                // SAFETY: see KERNELS.
                unsafe { panel_f::<f32>(w, cols, rows, x, n, out) }
            },
            f16: |w, cols, rows, x, n, out| {
                // SAFETY: see KERNELS.
                unsafe { panel_f::<f16>(w, cols, rows, x, n, out) }
            },
            q8_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ8_0>(w, nb, rows, act, n, g, out) }
            },
            q4_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ4_0>(w, nb, rows, act, n, g, out) }
            },
            q4_1: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ4_1>(w, nb, rows, act, n, g, out) }
            },
            q5_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ5_0>(w, nb, rows, act, n, g, out) }
            },
            q2_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ2K>(w, nb, rows, act, n, g, out) }
            },
            q4_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ4K>(w, nb, rows, act, n, g, out) }
            },
            q6_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ6K>(w, nb, rows, act, n, g, out) }
            },
            packed: $packed,
            packed_formats: $pf,
            dot_cols_f32: |q, kt, lanes, out| {
                // SAFETY: see KERNELS.
                unsafe { $dc32(q, kt, lanes, out) }
            },
            dot_cols_f16: |q, kt, lanes, out| {
                // SAFETY: see KERNELS.
                unsafe { $dc16(q, kt, lanes, out) }
            },
            axpy_rows_f32: |a, v, out| {
                // SAFETY: see KERNELS.
                unsafe { $ar32(a, v, out) }
            },
            axpy_rows_f16: |a, v, out| {
                // SAFETY: see KERNELS.
                unsafe { $ar16(a, v, out) }
            },
            softmax_block: |x, scale, state| {
                // SAFETY: see KERNELS.
                unsafe { softmax_block(x, scale, state) }
            },
            swiglu: |g, u| {
                // SAFETY: see KERNELS.
                unsafe { swiglu(g, u) }
            },
            geglu: |g, u| {
                // SAFETY: see KERNELS.
                unsafe { geglu(g, u) }
            },
            quantize32: |x, g, q, d, s, i| {
                // SAFETY: see KERNELS.
                unsafe { $q32(x, g, q, d, s, i) }
            },
            quantize_k: |x, g, out| {
                // SAFETY: see KERNELS.
                unsafe { quantize_k(x, g, out) }
            },
        };

        /// [`crate::vec_f32::dot_cols`]: tiles of up to 3 heads × 16 lanes keep both partial sums of every output
        /// in registers (12 accumulators), and each key load serves every head of the tile.
        ///
        /// # Safety
        /// The CPU must have this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn dot_cols<W: WF>(q: &[f32], kt: &[W], lanes: usize, out: &mut [f32]) {
            let (hd, heads) = crate::vec_f32::dot_cols_shape(q.len(), kt.len(), lanes, out.len());
            let mut j = 0;
            while j < lanes {
                let wide = lanes - j >= 16;
                let mut h = 0;
                while h < heads {
                    let hh = (heads - h).min(3);
                    // SAFETY: the shape is checked, so heads h..h + hh and lanes j..j + 8 or 16 lie inside q, kt
                    // and out; the caller has the features.
                    unsafe {
                        match (hh, wide) {
                            (3, true) => cols_tile::<W, 3, 2>(q, kt, lanes, hd, h, j, out),
                            (2, true) => cols_tile::<W, 2, 2>(q, kt, lanes, hd, h, j, out),
                            (_, true) => cols_tile::<W, 1, 2>(q, kt, lanes, hd, h, j, out),
                            (3, false) => cols_tile::<W, 3, 1>(q, kt, lanes, hd, h, j, out),
                            (2, false) => cols_tile::<W, 2, 1>(q, kt, lanes, hd, h, j, out),
                            (_, false) => cols_tile::<W, 1, 1>(q, kt, lanes, hd, h, j, out),
                        }
                    }
                    h += hh;
                }
                j += if wide { 16 } else { 8 };
            }
        }

        /// Heads `h0..h0 + H` × lanes `j..j + 8·V` of [`dot_cols`].
        ///
        /// # Safety
        /// Those heads and lanes must exist in `q`, `kt` and `out` (checked by `dot_cols_shape`); the CPU must have
        /// this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn cols_tile<W: WF, const H: usize, const V: usize>(
            q: &[f32],
            kt: &[W],
            lanes: usize,
            hd: usize,
            h0: usize,
            j: usize,
            out: &mut [f32],
        ) {
            // SAFETY: every offset stays below h0·hd + H·hd ≤ q.len(), (hd − 1)·lanes + j + 8V ≤ kt.len() and
            // (h0 + H − 1)·lanes + j + 8V ≤ out.len(), by the caller's contract.
            unsafe {
                let qp = q.as_ptr().add(h0 * hd);
                let kp = kt.as_ptr().add(j);
                let mut even = [[_mm256_setzero_ps(); V]; H];
                let mut odd = [[_mm256_setzero_ps(); V]; H];
                let step = |acc: &mut [[__m256; V]; H], d: usize| {
                    let k: [__m256; V] = std::array::from_fn(|v| W::ldp(kp.add(d * lanes + 8 * v)));
                    for h in 0..H {
                        let qb = _mm256_set1_ps(*qp.add(h * hd + d));
                        for v in 0..V {
                            acc[h][v] = _mm256_fmadd_ps(qb, k[v], acc[h][v]);
                        }
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
                    for v in 0..V {
                        _mm256_storeu_ps(op.add(h * lanes + 8 * v), _mm256_add_ps(even[h][v], odd[h][v]));
                    }
                }
            }
        }

        #[target_feature(enable = $feat)]
        fn dot_cols_f32(q: &[f32], kt: &[f32], lanes: usize, out: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { dot_cols(q, kt, lanes, out) }
        }

        #[target_feature(enable = $feat)]
        fn dot_cols_f16(q: &[f32], kt: &[f16], lanes: usize, out: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { dot_cols(q, kt, lanes, out) }
        }

        /// [`crate::vec_f32::axpy_rows`]: up to 4 heads × 16 outputs (or 2 heads × 32) stay in registers while the
        /// run's rows stream past, each row loaded once for all of them. Per element the fmas come in row order, as
        /// a sequence of `axpy` calls would do them.
        ///
        /// # Safety
        /// The CPU must have this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn axpy_rows<W: WF>(a: AxpyRows<'_>, v: &[W], out: &mut [f32]) {
            let heads = a.heads(v.len(), out.len());
            if a.n == 0 {
                return;
            }
            let width = a.width;
            let mut h = 0;
            while h < heads {
                let hh = (heads - h).min(4);
                let mut i = 0;
                // SAFETY (all tiles): `heads` checked the lengths, so heads h..h + hh, rows 0..n and outputs
                // i..i + 8V (≤ width) lie inside w, v and out; the caller has the features.
                unsafe {
                    if hh <= 2 {
                        while i + 32 <= width {
                            match hh {
                                2 => rows_tile::<W, 2, 4>(&a, v, out, h, i),
                                _ => rows_tile::<W, 1, 4>(&a, v, out, h, i),
                            }
                            i += 32;
                        }
                    } else {
                        while i + 16 <= width {
                            match hh {
                                4 => rows_tile::<W, 4, 2>(&a, v, out, h, i),
                                _ => rows_tile::<W, 3, 2>(&a, v, out, h, i),
                            }
                            i += 16;
                        }
                    }
                    while i + 8 <= width {
                        match hh {
                            4 => rows_tile::<W, 4, 1>(&a, v, out, h, i),
                            3 => rows_tile::<W, 3, 1>(&a, v, out, h, i),
                            2 => rows_tile::<W, 2, 1>(&a, v, out, h, i),
                            _ => rows_tile::<W, 1, 1>(&a, v, out, h, i),
                        }
                        i += 8;
                    }
                }
                for hx in h..h + hh {
                    for ii in i..width {
                        let o = &mut out[hx * width + ii];
                        for j in 0..a.n {
                            // SAFETY: as above; `get` checks its bounds.
                            *o = a.w[hx * a.w_stride + j].mul_add(unsafe { W::get(v, j * a.v_stride + ii) }, *o);
                        }
                    }
                }
                h += hh;
            }
        }

        /// Heads `h0..h0 + H` × outputs `i..i + 8·V` of [`axpy_rows`].
        ///
        /// # Safety
        /// Those heads and outputs, and the `n` rows, must exist in `a.w`, `v` and `out` (checked by
        /// `AxpyRows::heads`); the CPU must have this level's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows_tile<W: WF, const H: usize, const V: usize>(
            a: &AxpyRows<'_>,
            v: &[W],
            out: &mut [f32],
            h0: usize,
            i: usize,
        ) {
            // SAFETY: offsets stay below (h0 + H − 1)·width + i + 8V ≤ out.len(), (n − 1)·v_stride + i + 8V ≤
            // v.len() and (h0 + H − 1)·w_stride + n ≤ w.len(), by the caller's contract.
            unsafe {
                let op = out.as_mut_ptr().add(h0 * a.width + i);
                let wp = a.w.as_ptr().add(h0 * a.w_stride);
                let vp = v.as_ptr().add(i);
                let mut acc: [[__m256; V]; H] =
                    std::array::from_fn(|h| std::array::from_fn(|x| _mm256_loadu_ps(op.add(h * a.width + 8 * x))));
                for j in 0..a.n {
                    let row: [__m256; V] = std::array::from_fn(|x| W::ldp(vp.add(j * a.v_stride + 8 * x)));
                    for h in 0..H {
                        let wb = _mm256_set1_ps(*wp.add(h * a.w_stride + j));
                        for x in 0..V {
                            acc[h][x] = _mm256_fmadd_ps(wb, row[x], acc[h][x]);
                        }
                    }
                }
                for h in 0..H {
                    for x in 0..V {
                        _mm256_storeu_ps(op.add(h * a.width + 8 * x), acc[h][x]);
                    }
                }
            }
        }

        #[target_feature(enable = $feat)]
        fn axpy_rows_f32(a: AxpyRows<'_>, v: &[f32], out: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { axpy_rows::<f32>(a, v, out) }
        }

        #[target_feature(enable = $feat)]
        fn axpy_rows_f16(a: AxpyRows<'_>, v: &[f16], out: &mut [f32]) {
            // SAFETY: this function has the level's features.
            unsafe { axpy_rows::<f16>(a, v, out) }
        }

        /// [`crate::vec_f32::softmax_block`], vectorised for this level.
        #[target_feature(enable = $feat)]
        fn softmax_block(x: &mut [f32], scale: f32, state: &mut crate::vec_f32::SoftmaxState) -> f32 {
            crate::vec_f32::softmax_block_impl(x, scale, state)
        }

        /// [`crate::vec_f32::swiglu`], vectorised for this level.
        #[target_feature(enable = $feat)]
        fn swiglu(g: &mut [f32], u: &[f32]) {
            crate::vec_f32::swiglu_impl(g, u)
        }

        /// [`crate::vec_f32::geglu`], vectorised for this level.
        #[target_feature(enable = $feat)]
        fn geglu(g: &mut [f32], u: &[f32]) {
            crate::vec_f32::geglu_impl(g, u)
        }

        /// As `quantize32`, for Q8_K.
        #[target_feature(enable = $feat)]
        fn quantize_k(x: &[f32], group: usize, out: &mut [BlockQ8K]) {
            crate::matmul::quantize_row_k_impl(x, group, out)
        }

        // ---------------------------------------------------------------------------------------------------
        // Small helpers.

        #[inline]
        #[target_feature(enable = $feat)]
        fn h2f(h: f16) -> f32 {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        fn hsum(v: __m256) -> f32 {
            // 8 lanes → 4 → 2 → 1, always in the same order.
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        fn ld32<T: Copy>(b: &[T; 32]) -> __m256i {
            const { assert!(std::mem::size_of::<T>() == 1) };
            // SAFETY: 32 one-byte elements are 32 readable bytes; loadu has no alignment requirement.
            unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        fn ld16b(b: &[u8; 16]) -> __m128i {
            // SAFETY: 16 readable bytes; no alignment requirement.
            unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
        }

        /// Eight f32 from `s[i..i + 8]` (panics if out of bounds).
        #[inline]
        #[target_feature(enable = $feat)]
        fn ld8f(s: &[f32], i: usize) -> __m256 {
            let s = &s[i..i + 8];
            // SAFETY: the slice above has 8 elements.
            unsafe { _mm256_loadu_ps(s.as_ptr()) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        fn st8f(s: &mut [f32], i: usize, v: __m256) {
            let s = &mut s[i..i + 8];
            // SAFETY: the slice above has 8 elements.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
        }

        /// Eight f16 from `s[i..i + 8]`, widened to f32.
        #[inline]
        #[target_feature(enable = $feat)]
        fn ld8h(s: &[f16], i: usize) -> __m256 {
            let s = &s[i..i + 8];
            // SAFETY: the slice above has 8 two-byte elements = 16 readable bytes.
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(s.as_ptr().cast()) })
        }

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
        }
        impl WF for f32 {
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
            while i < a.end {
                match a.end - i {
                    1 => go!(1),
                    2 => go!(2),
                    _ => go!(3),
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
