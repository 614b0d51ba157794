//! AMX (Advanced Matrix Extensions) tiles: the `amx` level, which is the AVX-512 level with tile kernels for
//! prompts and batches of 16 rows or more, this file's for F16 weights (its `packed_f` entry) and
//! [`super::amx_quant`]'s for the 32-weight quantized panels (its `packed` entry).
//!
//! An AMX tile multiply (`tdpbf16ps`) forms a 16 × 16 block of f32 dot products over 32 bf16 pairs in one
//! instruction, on a unit of its own: 8,192 multiply-adds, against 16 for a 512-bit FMA. bf16 keeps 8 significant
//! bits, so each operand is split into two bf16 parts, `v = hi + lo`. For an F16 weight the split is exact (11
//! significant bits: 8 in `hi`, the rest in `lo`); an f32 activation keeps 16 of its 24 bits. Three products,
//! `xh·wh + xl·wh + xh·wl`, leave out only `xl·wl`, about 2⁻¹⁶ of each term: the result is closer to the f32
//! product than llama.cpp's F16 path, which rounds each activation to f16 (11 bits). It is not bit-identical to
//! the FMA kernels, so its tests bound the error instead (`kernels/tests/packed.rs`).
//!
//! Unlike the quantized formats, whose every 32-weight block has scales of its own (so each block's 16 × 16 sums
//! leave the tile unit for a float epilogue, see [`super::amx_quant`]), float weights need no epilogue: a tile
//! accumulates over the whole row and is stored once.
//!
//! F32 weights stay on the FMA kernel: splitting them into two bf16 parts would drop 8 of their 24 bits.
//!
//! Tiles (palette 1, every tile 16 rows of 64 bytes): `tmm0`, `tmm1` one part of two row tiles' 32 values (A,
//! 16 activation rows each), `tmm2`, `tmm3` one part of two panels' block of 32 columns × 16 rows, as bf16 pairs
//! (B), `tmm4..tmm7` the f32 results of up to 32 activation rows × two panels (C). Every operand tile is stored as
//! 1 KB in one piece, so tiles load and store with a stride of one 64-byte line.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use super::packed512;
use crate::dispatch::{Isa, Kernels, OutSink};
use crate::packed::{Line, PANEL_ROWS, PackedFormat, PackedView, Sections, check_args_f};

/// Activation rows per A tile (the most a tile holds).
pub(super) const TILE_M: usize = 16;

/// The `amx` level's table: the AVX-512 level's, with [`panel_f`] for the float panels. Only
/// [`crate::dispatch`] hands it out, after [`supported`] and the AVX-512 level's feature check: the safety argument
/// of the wrapper.
pub(crate) static KERNELS: Kernels = Kernels {
    isa: Isa::Amx,
    packed: Some(|w, panels, act, n, g, out| {
        // SAFETY: see KERNELS.
        unsafe { super::amx_quant::panel(w, panels, act, n, g, out) }
    }),
    packed_f: Some(|w, panels, x, n, out| {
        // SAFETY: see KERNELS.
        unsafe { panel_f(w, panels, x, n, out) }
    }),
    ..super::avx512::KERNELS
};

/// Whether this CPU has AMX tiles with bf16 products and the OS lets this process use them. The permission
/// (Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM)`) is asked for once, for the whole process, here: a tile instruction
/// without it raises SIGILL, so nothing runs this module's code unless this returned true.
pub(crate) fn supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8. (The leaf exists on
        // every CPU with AVX-512, which the level also requires; every CPU with AMX so far has both products.)
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on every x86-64 CPU.
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        let tiles = (1 << 22) | (1 << 24) | (1 << 25);
        leaf7.edx & tiles == tiles && request_tile_data()
    })
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this arch_prctl only asks the kernel to allow (and size signal frames for) the tile data state.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// The 64-byte operand of `ldtilecfg`: palette 1, then each tile's bytes per row (u16 × 16) and rows (u8 × 16).
/// Both tile kernels use the same roles: `tmm0`, `tmm1` A tiles, `tmm2`, `tmm3` B tiles, `tmm4..tmm7` C tiles.
#[repr(C, align(64))]
pub(super) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Every tile 16 rows of 64 bytes (this file's F16 kernel).
    pub(super) const FULL: TileConfig = TileConfig::shaped(64, 16);

    /// A tiles of 16 rows × `a_bytes`, B tiles of `b_rows` lines of 64 bytes, C tiles of 16 rows of 64 bytes.
    pub(super) const fn shaped(a_bytes: usize, b_rows: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            let (bytes, rows) = match t {
                0 | 1 => (a_bytes, TILE_M),
                2 | 3 => (64, b_rows),
                _ => (64, TILE_M),
            };
            c[16 + 2 * t] = bytes as u8;
            c[17 + 2 * t] = (bytes >> 8) as u8;
            c[48 + t] = rows as u8;
            t += 1;
        }
        TileConfig(c)
    }

    /// Loads this configuration into the tile unit.
    ///
    /// # Safety
    /// [`supported`] returned true.
    #[inline]
    pub(super) unsafe fn load(&self) {
        // SAFETY: a valid palette-1 configuration; the caller's contract gives the tile state.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Gives the tile state back (a thread not using tiles saves and restores less on a context switch).
///
/// # Safety
/// [`supported`] returned true.
#[inline]
pub(super) unsafe fn release() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Loads tile `T` from its lines, `stride` bytes apart, at `p`.
///
/// # Safety
/// The tile configuration is loaded, and every line of tile `T` is readable at `p + i·stride`.
#[inline(always)]
pub(super) unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) p, s = in(reg) stride, options(nostack, readonly))
    }
}

/// Stores tile `T` (16 lines of 64 bytes) at `p`.
///
/// # Safety
/// The configuration is loaded; 1 KB is writable at `p`.
#[inline(always)]
pub(super) unsafe fn store<const T: u8>(p: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) 64usize, options(nostack))
    }
}

/// `C += A · B` over bf16 pairs, in f32.
///
/// # Safety
/// The configuration is loaded and tiles `A` and `B` hold data.
#[inline(always)]
unsafe fn product<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's contract; tile instructions touch no memory here.
    unsafe { asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem)) }
}

/// Zeroes tile `T`.
///
/// # Safety
/// The configuration is loaded.
#[inline(always)]
pub(super) unsafe fn zero<const T: u8>() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) }
}

/// A thread's buffers: the activations' `hi` and `lo` parts, and two panels' B tiles (`hi` then `lo`, 1 KB each
/// per block).
#[derive(Default)]
struct Buffers {
    x_hi: Vec<Line>,
    x_lo: Vec<Line>,
    w: Vec<Line>,
}

thread_local! {
    static BUFFERS: RefCell<Option<Buffers>> = const { RefCell::new(None) };
}

/// Each f32 lane rounded to the nearest bf16 (ties to even), as f32 bits whose top half is the bf16.
#[inline(always)]
fn round_bf16(v: __m512) -> __m512i {
    // SAFETY: plain AVX-512 F arithmetic on registers; the callers have the feature.
    unsafe {
        let bits = _mm512_castps_si512(v);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)))
    }
}

/// `v = hi + lo` as two bf16 parts (each as [`round_bf16`] gives it): `hi` the nearest bf16 to `v`, `lo` the
/// nearest to the (exact) remainder.
#[inline(always)]
fn split(v: __m512) -> [__m512i; 2] {
    // SAFETY: as `round_bf16`.
    unsafe {
        let hi = round_bf16(v);
        let hi_f = _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(0xFFFF_0000_u32 as i32)));
        [hi, round_bf16(_mm512_sub_ps(v, hi_f))]
    }
}

/// The bf16 halves of 32 lanes (16 of `a`, then 16 of `b`) in the order `idx` picks them (as
/// `_mm512_permutex2var_epi16` indexes the 64 half-lanes of `a` and `b`).
#[inline(always)]
fn pick(a: __m512i, b: __m512i, idx: __m512i) -> __m512i {
    // SAFETY: AVX-512 BW on registers; the callers have the feature.
    unsafe { _mm512_permutex2var_epi16(a, idx, b) }
}

/// Half-lane indexes: the top halves of `a`'s lanes then `b`'s, in order (an activation row's 32 values).
#[inline(always)]
fn in_order() -> __m512i {
    let idx: [u16; 32] = std::array::from_fn(|i| (2 * i + 1) as u16);
    // SAFETY: 64 bytes read from a 64-byte array.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// Half-lane indexes: `a`'s and `b`'s top halves, lane by lane (two columns' values as bf16 pairs per row).
#[inline(always)]
fn in_pairs() -> __m512i {
    let idx: [u16; 32] = std::array::from_fn(|i| if i % 2 == 0 { i + 1 } else { 32 + i } as u16);
    // SAFETY: as above.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// The [`crate::dispatch::PanelPackedF`] kernel of the `amx` level: F16 panels against 16 or more activation
/// rows on the tile unit (the rows past a multiple of 16 and everything else on the 512-bit kernel).
///
/// # Safety
/// [`supported`] returned true, and the CPU has AVX-512 F, BW, VL and VNNI plus F16C and FMA.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel_f(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    check_args_f(&w, &panels, x, n_act);
    let tiled = if w.format == PackedFormat::F16 { n_act / TILE_M * TILE_M } else { 0 };
    if tiled > 0 && !panels.is_empty() {
        // SAFETY: the arguments were checked; the caller has AMX and the features.
        unsafe { run_f16(&w, panels.clone(), x, tiled, out) };
    }
    if tiled < n_act {
        let cols = w.nb * 32;
        // SAFETY: the caller has the features; the rest of the checked rows.
        unsafe { packed512::panel_f(w, panels, &x[tiled * cols..], n_act - tiled, &out.rows_from(tiled)) };
    }
}

/// Activation rows `0..rows` (a multiple of 16) against F16 `panels`: the rows split into bf16 parts once, then
/// each pair of panels' blocks split once and met by the rows, 32 at a time (two row tiles × two panels).
///
/// # Safety
/// As [`panel_f`], with `rows` ≤ the checked rows, a multiple of 16, and an F16 matrix.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_f16(w: &PackedView<'_>, panels: Range<usize>, x: &[f32], rows: usize, out: &OutSink<'_>) {
    let nb = w.nb;
    let cols = nb * 32;
    let sec = Sections::of(PackedFormat::F16, nb);
    BUFFERS.with_borrow_mut(|bufs| {
        let bufs = bufs.get_or_insert_with(Buffers::default);
        // An activation row is `cols` bf16 per part, `nb` lines; a panel `nb` blocks of 16 lines per part.
        bufs.x_hi.resize(rows * nb, Line([0; 64]));
        bufs.x_lo.resize(rows * nb, Line([0; 64]));
        bufs.w.resize(2 * nb * 32, Line([0; 64]));
        let order = in_order();
        for (i, vals) in x[..rows * cols].chunks_exact(32).enumerate() {
            // Row r's block b goes to line b·16 + r % 16 of row tile r / 16 (each A tile 1 KB, contiguous).
            let (r, b) = (i / nb, i % nb);
            let line = ((r / TILE_M) * nb + b) * TILE_M + r % TILE_M;
            // SAFETY: 32 f32 of the row; `line` < rows·nb, within each part buffer.
            unsafe {
                let a = split(_mm512_loadu_ps(vals.as_ptr()));
                let b = split(_mm512_loadu_ps(vals.as_ptr().add(16)));
                _mm512_store_si512(bufs.x_hi.as_mut_ptr().add(line).cast(), pick(a[0], b[0], order));
                _mm512_store_si512(bufs.x_lo.as_mut_ptr().add(line).cast(), pick(a[1], b[1], order));
            }
        }
        let pairs = in_pairs();
        let (xh, xl) = (bufs.x_hi.as_ptr().cast::<u8>(), bufs.x_lo.as_ptr().cast::<u8>());
        // SAFETY: the caller has AMX.
        unsafe { TileConfig::FULL.load() };
        let mut c = [[0f32; PANEL_ROWS]; TILE_M];
        let mut p = panels.start;
        while p < panels.end {
            let n = (panels.end - p).min(2);
            // SAFETY: the panels' blocks lie at `sec.qs(b)` in checked panels (32 columns of 16 f16 each); the
            // buffer holds 2 panels × nb blocks × 2 parts × 16 lines.
            unsafe {
                for i in 0..n {
                    let panel = w.bytes.as_ptr().add((p + i) * w.panel_bytes);
                    let dst = bufs.w.as_mut_ptr().add(i * nb * 32);
                    for b in 0..nb {
                        let blk = panel.add(sec.qs(b));
                        for kk in 0..16 {
                            let col = |k: usize| _mm512_cvtph_ps(_mm256_load_si256(blk.add(k * 32).cast()));
                            let (ca, cb) = (split(col(2 * kk)), split(col(2 * kk + 1)));
                            _mm512_store_si512(dst.add(b * 32 + kk).cast(), pick(ca[0], cb[0], pairs));
                            _mm512_store_si512(dst.add(b * 32 + 16 + kk).cast(), pick(ca[1], cb[1], pairs));
                        }
                    }
                }
            }
            let wp = bufs.w.as_ptr().cast::<u8>();
            let parts = Parts { xh, xl, w0: wp, w1: wp.wrapping_add(nb * 2048) };
            let mut r0 = 0;
            while r0 < rows {
                let m = ((rows - r0) / TILE_M).min(2);
                // SAFETY: rows r0..r0 + 16·m exist in the part buffers; panels p..p + n's B tiles are in `wp`.
                unsafe {
                    match (m, n) {
                        (2, 2) => tiles::<2, 2>(nb, &parts, r0),
                        (2, _) => tiles::<2, 1>(nb, &parts, r0),
                        (_, 2) => tiles::<1, 2>(nb, &parts, r0),
                        _ => tiles::<1, 1>(nb, &parts, r0),
                    }
                    for t in 0..m {
                        for i in 0..n {
                            let dst = c.as_mut_ptr().cast::<u8>();
                            match 2 * t + i {
                                0 => store::<4>(dst),
                                1 => store::<5>(dst),
                                2 => store::<6>(dst),
                                _ => store::<7>(dst),
                            }
                            for (k, lanes) in c.iter().enumerate() {
                                out.put_row(r0 + t * TILE_M + k, (p + i) * PANEL_ROWS, lanes);
                            }
                        }
                    }
                }
                r0 += m * TILE_M;
            }
            p += n;
        }
        // SAFETY: the caller has AMX.
        unsafe { release() };
    });
}

/// Where [`tiles`] finds its operands: the activations' `hi` and `lo` parts (row tile `t`'s block `b` as 1 KB
/// at `1024·(t·nb + b)`), and two panels' B tiles (block `b`'s `hi` at `2048·b`, its `lo` 1 KB further). Every
/// tile is 1 KB in one piece, so that a tile load reads whole lines in order: with the A tiles' rows a row of the
/// matrix apart, the loads were most of the kernel's time.
struct Parts {
    xh: *const u8,
    xl: *const u8,
    w0: *const u8,
    w1: *const u8,
}

/// The C tiles of `M` row tiles (from row `r0`) × `N` panels: `tmm4 + 2t + i` for row tile `t`, panel `i`.
/// Each block is three steps, `xl·wh`, `xh·wh` and `xh·wl`, and each step the 2 × 2 pattern of a tiled matrix
/// product: four products of two A and two B tiles. In that order the second step reloads only the A tiles and the
/// third only the B tiles, 8 loads per block instead of 12 (one thread, 512 rows, median G multiply-adds/s of
/// interleaved slices: 1536×576 107 → 129 and 132 → 145, 576×1536 96 → 105; the tile loads here cost about as
/// much as the products). Every tile feeds two products, so a load waits only for
/// the first of them to finish with the register it refills, and the unit stays busy (with a single C tile per
/// panel, each A load waited for the products before it: perf put the samples on the loads).
///
/// # Safety
/// The configuration is loaded; the part buffers hold the rows, `w0` (and `w1` when `N` = 2) the panels' blocks.
#[inline(always)]
unsafe fn tiles<const M: usize, const N: usize>(nb: usize, x: &Parts, r0: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        zero::<4>();
        if N > 1 {
            zero::<5>();
        }
        if M > 1 {
            zero::<6>();
            if N > 1 {
                zero::<7>();
            }
        }
        let tile = nb * 1024;
        for b in 0..nb {
            let a = (r0 / TILE_M * nb + b) * 1024;
            // `xl·wh`, `xh·wh`, `xh·wl`: each step after the first reloads only the operand that changes.
            for (step, (xs, ws)) in [(x.xl, 0), (x.xh, 0), (x.xh, 1024)].into_iter().enumerate() {
                if step < 2 {
                    load::<0>(xs.add(a), 64);
                    if M > 1 {
                        load::<1>(xs.add(a + tile), 64);
                    }
                }
                if step != 1 {
                    load::<2>(x.w0.add(2048 * b + ws), 64);
                    if N > 1 {
                        load::<3>(x.w1.add(2048 * b + ws), 64);
                    }
                }
                product::<4, 0, 2>();
                if N > 1 {
                    product::<5, 0, 3>();
                }
                if M > 1 {
                    product::<6, 1, 2>();
                    if N > 1 {
                        product::<7, 1, 3>();
                    }
                }
            }
        }
    }
}
