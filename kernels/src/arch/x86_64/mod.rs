//! The x86-64 kernels, written once and instantiated per instruction-set level.
//!
//! `x86_kernels!` expands to a whole set of kernels compiled with one `#[target_feature]` string, one macro per
//! concern: the table (`table.rs`), attention (`attention.rs`), f32 helpers and F32/F16 weights (`float.rs`), and
//! the 32-weight formats (`blocks32.rs`) and K-quants (`kquants.rs`) in their GGUF layout. The panel kernels for
//! repacked weights ([`crate::packed`]) are plain modules, one per level (`packed256.rs`, `packed512.rs`), over the
//! same panel layout. The module that invokes the macro supplies the few primitives that differ between levels (the
//! 8-bit dot product, the 16-bit multiply-accumulate, the Q8_0 weight trick). All its loops work on 256-bit
//! vectors: one 32-weight block, or one 32-weight group of a K-quant super-block, per register.
//!
//! The primitives each level must define (all `#[target_feature]` safe fns over `__m256i`):
//! - `dot_u8i8(acc, u, q)`: each i32 lane of `acc` plus the four products `u·q` of its bytes (u unsigned, q signed,
//!   |u| ≤ 31 on the AVX2 path so the 16-bit pair sums cannot saturate);
//! - `dot_q8_0(acc, w, q)` and `Q8_0_OFF`: the same for signed Q8_0 weights `w`; the kernel subtracts
//!   `Q8_0_OFF · Σq` (128 when `w` is biased to unsigned, 0 when the sign is moved onto `q`);
//! - `madd16_acc(acc, p, s)`: `acc` plus the pairwise products of the i16 lanes of `p` and `s`.
//!
//! `task_rows = ..` is how many activation rows a prompt's matmul task gets (whole chunks of the level's panel
//! kernel; see [`crate::dispatch::Kernels::task_rows`]).
//! `quantize32 = ..` names the level's activation quantizer (the macro's 256-bit `quantize32`, or a wider one).
//! `attention = [..]` names the level's attention kernels (`dot_cols` and `axpy_rows`, f32 and f16 caches, and the
//! f16 → f32 conversion):
//! the 256-bit ones the macro defines, or wider ones of the level's own that fall back on them.

#[macro_use]
mod table;
#[macro_use]
mod attention;
#[macro_use]
mod float;
#[macro_use]
mod blocks32;
#[macro_use]
mod kquants;

macro_rules! x86_kernels {
    (
        features = $feat:literal,
        isa = $isa:expr,
        tile32 = $R32:literal x $C32:literal,
        kernel32 = $tile32:ident: $W32b:ident,
        tilek = $RK:literal x $CK:literal,
        packed = $packed:expr,
        packed_f = $packed_f:expr,
        packed_formats = $pf:expr,
        attention = [$dc32:ident, $dc16:ident, $ar32:ident, $ar16:ident, $cvt:ident],
        quantize32 = $q32:ident,
        task_rows = $task_rows:expr
    ) => {
        use std::ops::Range;

        use half::f16;

        use crate::dispatch::{Act32, Kernels, OutSink};
        use crate::quant::{BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8K};
        use crate::vec_f32::AxpyRows;

        x86_table!(
            features = $feat,
            isa = $isa,
            packed = $packed,
            packed_f = $packed_f,
            packed_formats = $pf,
            attention = [$dc32, $dc16, $ar32, $ar16, $cvt],
            quantize32 = $q32,
            task_rows = $task_rows
        );
        x86_attention!($feat);
        x86_float!($feat);
        x86_blocks32!($feat, tile = $R32 x $C32, kernel = $tile32: $W32b);
        x86_kquants!($feat, tile = $RK x $CK);

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
    };
}
