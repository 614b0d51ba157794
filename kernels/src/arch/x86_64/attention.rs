//! Attention's f32 kernels at 256 bits (scores as column sums over transposed keys, weighted value rows), and the
//! elementwise softmax, SwiGLU and GeGLU steps compiled for the level.

macro_rules! x86_attention {
    ($feat:literal) => {
        /// [`crate::vec_f32::dot_cols`]: tiles of up to 3 heads × 16 lanes (or, for f16 keys, 4 heads × 8) keep
        /// both partial sums of every output in registers (12 or 8 accumulators), and each key load serves every
        /// head of the tile.
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
                    // f16 keys in runs of 4 heads (Gemma 3's group, Llama 3's): two 4 × 8 tiles, each
                    // converting every key once for all four heads. As 3 × 16 and 1 × 16 tiles the keys were
                    // converted twice, and on Zen 1, where `vcvtph2ps` costs about as much as the three
                    // multiply-adds it feeds, the scores of 4 heads × 256 dimensions took 1.8 µs a block against
                    // 1.4 µs this way (one thread, L1-resident; 2.1 → 1.7 µs streamed from memory). The
                    // arithmetic per output is the same either way.
                    if W::CONVERTS && (heads - h).is_multiple_of(4) {
                        // SAFETY: as below, with heads h..h + 4.
                        unsafe {
                            cols_tile::<W, 4, 1>(q, kt, lanes, hd, h, j, out);
                            if wide {
                                cols_tile::<W, 4, 1>(q, kt, lanes, hd, h, j + 8, out);
                            }
                        }
                        h += 4;
                        continue;
                    }
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
                if W::CONVERTS && H == 3 && V == 2 && hd >= 2 {
                    // f16 keys, 3 heads × 16 lanes (SmolLM2's group): the pairs of dimensions in assembly (see
                    // `cols_f16_3x2`), with the same operations in the same order as `step`.
                    let mut e = [even[0][0], even[0][1], even[1][0], even[1][1], even[2][0], even[2][1]];
                    let mut o = [odd[0][0], odd[0][1], odd[1][0], odd[1][1], odd[2][0], odd[2][1]];
                    let q = [qp, qp.add(hd), qp.add(2 * hd)];
                    cols_f16_3x2(kp.cast(), 2 * lanes, q, hd / 2, &mut e, &mut o);
                    d = hd / 2 * 2;
                    for h in 0..3 {
                        for v in 0..2 {
                            even[h][v] = e[2 * h + v];
                            odd[h][v] = o[2 * h + v];
                        }
                    }
                }
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

        /// The first `2·pairs` dimensions of a 3-head × 16-lane f16 score tile of [`cols_tile`]: dimension `d`'s 16
        /// keys at `kp + d·stride` bytes, head h's query values from `q[h]` on; `e` and `o` are the even and odd
        /// partial sums, (head, half) in order. In assembly, loop included, so that the register allocation is
        /// ours: 12 accumulators, 2 keys and a broadcast take 15 of the 16 registers. Compiled from the loop, LLVM
        /// hoisted the next pair's key conversions, ran out of registers, and kept two accumulators on the stack
        /// with a dozen register moves a pair: 1,056 cycles per 16 keys × 64 dimensions × 3 heads against 650-700
        /// this way (one thread, L1-resident, Zen 1, where each conversion costs about as much as three of the
        /// multiply-adds it feeds); with only the pair in assembly, LLVM still kept one accumulator on the stack.
        ///
        /// # Safety
        /// `pairs` ≥ 1; 16 f16 must be readable at `kp + d·stride` for d < 2·pairs, and 2·pairs f32 at each `q[h]`;
        /// the CPU must have AVX2, FMA and F16C.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn cols_f16_3x2(
            kp: *const u8,
            stride: usize,
            q: [*const f32; 3],
            pairs: usize,
            e: &mut [__m256; 6],
            o: &mut [__m256; 6],
        ) {
            debug_assert!(pairs >= 1);
            // SAFETY: the caller's contract; every read is one of those named there.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "vcvtph2ps {k0}, xmmword ptr [{kp}]",
                    "vcvtph2ps {k1}, xmmword ptr [{kp} + 16]",
                    "vbroadcastss {b}, dword ptr [{q0}]",
                    "vfmadd231ps {e0}, {b}, {k0}",
                    "vfmadd231ps {e1}, {b}, {k1}",
                    "vbroadcastss {b}, dword ptr [{q1}]",
                    "vfmadd231ps {e2}, {b}, {k0}",
                    "vfmadd231ps {e3}, {b}, {k1}",
                    "vbroadcastss {b}, dword ptr [{q2}]",
                    "vfmadd231ps {e4}, {b}, {k0}",
                    "vfmadd231ps {e5}, {b}, {k1}",
                    "vcvtph2ps {k0}, xmmword ptr [{kp} + {st}]",
                    "vcvtph2ps {k1}, xmmword ptr [{kp} + {st} + 16]",
                    "vbroadcastss {b}, dword ptr [{q0} + 4]",
                    "vfmadd231ps {o0}, {b}, {k0}",
                    "vfmadd231ps {o1}, {b}, {k1}",
                    "vbroadcastss {b}, dword ptr [{q1} + 4]",
                    "vfmadd231ps {o2}, {b}, {k0}",
                    "vfmadd231ps {o3}, {b}, {k1}",
                    "vbroadcastss {b}, dword ptr [{q2} + 4]",
                    "vfmadd231ps {o4}, {b}, {k0}",
                    "vfmadd231ps {o5}, {b}, {k1}",
                    "lea {kp}, [{kp} + 2*{st}]",
                    "add {q0}, 8",
                    "add {q1}, 8",
                    "add {q2}, 8",
                    "dec {n}",
                    "jnz 2b",
                    kp = inout(reg) kp => _,
                    st = in(reg) stride,
                    q0 = inout(reg) q[0] => _,
                    q1 = inout(reg) q[1] => _,
                    q2 = inout(reg) q[2] => _,
                    n = inout(reg) pairs => _,
                    e0 = inout(ymm_reg) e[0],
                    e1 = inout(ymm_reg) e[1],
                    e2 = inout(ymm_reg) e[2],
                    e3 = inout(ymm_reg) e[3],
                    e4 = inout(ymm_reg) e[4],
                    e5 = inout(ymm_reg) e[5],
                    o0 = inout(ymm_reg) o[0],
                    o1 = inout(ymm_reg) o[1],
                    o2 = inout(ymm_reg) o[2],
                    o3 = inout(ymm_reg) o[3],
                    o4 = inout(ymm_reg) o[4],
                    o5 = inout(ymm_reg) o[5],
                    k0 = out(ymm_reg) _,
                    k1 = out(ymm_reg) _,
                    b = out(ymm_reg) _,
                    options(nostack, readonly),
                );
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

        /// [`crate::vec_f32::f16_to_f32`]: eight values per conversion instruction (F16C, which both levels have).
        /// The 512-bit level has its own form (`f16_to_f32_zmm`), which finishes its tail with this one.
        #[target_feature(enable = $feat)]
        fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
            assert_eq!(src.len(), dst.len(), "f16_to_f32: {} values into {}", src.len(), dst.len());
            let n = src.len();
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 ≤ n, the length of both slices; unaligned loads and stores.
                unsafe {
                    let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                }
                i += 8;
            }
            for (d, s) in dst[i..].iter_mut().zip(&src[i..]) {
                *d = s.to_f32();
            }
        }

        /// [`crate::vec_f32::dequant_q8`], vectorised for this level.
        #[target_feature(enable = $feat)]
        fn dequant_q8(q: &[i8], d: &[f32], lanes: usize, dst: &mut [f32]) {
            crate::vec_f32::dequant_q8_impl(q, d, lanes, dst)
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
    };
}
