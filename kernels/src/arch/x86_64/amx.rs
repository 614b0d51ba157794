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
//! F32 weights take three bf16 parts each, `v = v₀ + v₁ + v₂`, exactly (8 significant bits each, 24 in all), and
//! so do the activations. Six products, every pair of parts whose orders sum to at most 2 (`x₀w₀`, `x₀w₁`,
//! `x₁w₀`, `x₀w₂`, `x₁w₁`, `x₂w₀`), leave out terms of about 2⁻²⁴ of each product: as close to the f32 product as
//! an f32 multiply-add, where two parts (three products) would drop 8 of the weights' 24 bits. Six products cost
//! twice three, and the tile unit still does them several times faster than the 512-bit FMA kernel.
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

/// A thread's buffers: the activations' bf16 parts (one after another, all rows of a part together), and two
/// panels' B tiles (each block's parts one after another, 1 KB each).
#[derive(Default)]
struct Buffers {
    x: Vec<Line>,
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

/// `v` as `P` bf16 parts (each as [`round_bf16`] gives it): the first the nearest bf16 to `v`, each next one the
/// nearest to the remainder so far. Each remainder is exact in f32 (it is `v` less its leading bits), so three
/// parts hold all 24 bits of an f32 (`v` is their sum) and two all 11 of an f16.
#[inline(always)]
fn split<const P: usize>(v: __m512) -> [__m512i; P] {
    // SAFETY: as `round_bf16`.
    unsafe {
        // A loop rather than `array::from_fn`: a closure here would not inherit the caller's target features, and
        // its intrinsics would become calls.
        let mut parts = [_mm512_setzero_si512(); P];
        let mut rest = v;
        for part in &mut parts {
            *part = round_bf16(rest);
            let part_f = _mm512_castsi512_ps(_mm512_and_si512(*part, _mm512_set1_epi32(0xFFFF_0000_u32 as i32)));
            rest = _mm512_sub_ps(rest, part_f);
        }
        parts
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

/// The [`crate::dispatch::PanelPackedF`] kernel of the `amx` level: F16 and F32 panels against enough activation
/// rows (see [`tiled_rows`]) on the tile unit, 16 at a time (the rows past a multiple of 16, and calls with fewer
/// rows, on the 512-bit kernel).
///
/// # Safety
/// [`supported`] returned true, and the CPU has AVX-512 F, BW, VL and VNNI plus F16C and FMA.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel_f(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    check_args_f(&w, &panels, x, n_act);
    let tiled = tiled_rows(w.format, n_act);
    if tiled > 0 && !panels.is_empty() {
        // SAFETY: the arguments were checked; the caller has AMX and the features.
        unsafe {
            match w.format {
                PackedFormat::F16 => run_float::<2>(&w, panels.clone(), x, tiled, out),
                _ => run_float::<3>(&w, panels.clone(), x, tiled, out),
            }
        }
    }
    if tiled < n_act {
        let cols = w.nb * 32;
        // SAFETY: the caller has the features; the rest of the checked rows.
        unsafe { packed512::panel_f(w, panels, &x[tiled * cols..], n_act - tiled, &out.rows_from(tiled)) };
    }
}

/// How many of `n_act` activation rows [`panel_f`] takes to the tile unit: whole tiles of 16, once there are
/// enough of them. Below that, splitting every panel's weights into parts costs more than the tiles save (one
/// thread, 576 × 576, G multiply-adds/s of the 512-bit FMA kernel against the tiles: F16 60/50 at 16 rows and 60/87
/// at 32; F32 68/37 at 16, 69/61 at 32, 69/75 at 48 and 69/97 at 96).
pub(crate) fn tiled_rows(format: PackedFormat, n_act: usize) -> usize {
    let fewest = if format == PackedFormat::F16 { 32 } else { 48 };
    if n_act >= fewest { n_act / TILE_M * TILE_M } else { 0 }
}

/// The products of an F16 block, as (activation part, weight part): `x₁·w₀`, `x₀·w₀`, `x₀·w₁` (an F16 weight is
/// exactly two parts; `x₁·w₁`, about 2⁻¹⁶ of the term, is left out). Smallest first, and each step after the first
/// changes one operand, so it reloads only that one's tiles.
const F16_STEPS: [(usize, usize); 3] = [(1, 0), (0, 0), (0, 1)];

/// The products of an F32 block: every pair of parts whose orders sum to at most 2 (see the module documentation),
/// smallest first, each step changing one operand but the last (seven tile-pair loads for six products).
const F32_STEPS: [(usize, usize); 6] = [(2, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 0)];

/// The products of a block whose operands have `P` parts each (see [`F16_STEPS`] and [`F32_STEPS`]).
const fn steps<const P: usize>() -> &'static [(usize, usize)] {
    if P == 2 { &F16_STEPS } else { &F32_STEPS }
}

/// Activation rows `0..rows` (a multiple of 16) against float `panels` (F16 with `P` = 2 parts per value, F32 with
/// 3): the rows split into `P` bf16 parts once, then each group of panels (see [`group_panels`]) split into `P`
/// parts once and met by the rows, 32 at a time (two row tiles × two panels), one tile product per entry of
/// [`steps`].
///
/// # Safety
/// As [`panel_f`], with `rows` ≤ the checked rows, a multiple of 16, and a float matrix whose values are exactly
/// `P` bf16 parts (F16 2, F32 3).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_float<const P: usize>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    x: &[f32],
    rows: usize,
    out: &OutSink<'_>,
) {
    let nb = w.nb;
    let cols = nb * 32;
    let sec = Sections::of(w.format, nb);
    BUFFERS.with_borrow_mut(|bufs| {
        let bufs = bufs.get_or_insert_with(Buffers::default);
        // An activation row is `cols` bf16 per part, `nb` lines; a panel `nb` blocks of 16 lines per part.
        let part_lines = rows * nb;
        bufs.x.resize(P * part_lines, Line([0; 64]));
        let order = in_order();
        for (i, vals) in x[..rows * cols].chunks_exact(32).enumerate() {
            // Row r's block b goes to line b·16 + r % 16 of row tile r / 16 (each A tile 1 KB, contiguous).
            let (r, b) = (i / nb, i % nb);
            let line = ((r / TILE_M) * nb + b) * TILE_M + r % TILE_M;
            // SAFETY: 32 f32 of the row; `line` < rows·nb, within each part's lines.
            unsafe {
                let a = split::<P>(_mm512_loadu_ps(vals.as_ptr()));
                let b = split::<P>(_mm512_loadu_ps(vals.as_ptr().add(16)));
                for q in 0..P {
                    _mm512_store_si512(bufs.x.as_mut_ptr().add(q * part_lines + line).cast(), pick(a[q], b[q], order));
                }
            }
        }
        let pairs = in_pairs();
        // SAFETY: the caller has AMX.
        unsafe { TileConfig::FULL.load() };
        let mut c = [[0f32; PANEL_ROWS]; TILE_M];
        // One panel's split weights: nb blocks of P parts, 1 KB each.
        let panel_split = nb * P * 1024;
        let group = group_panels(panel_split);
        bufs.w.resize(group * nb * P * 16, Line([0; 64]));
        let mut g0 = panels.start;
        while g0 < panels.end {
            let g1 = (g0 + group).min(panels.end);
            // SAFETY: the panels' blocks lie at `sec.qs(b)` in checked panels (32 columns of 16 values each, f16 or
            // f32 as the format says); the buffer holds `group` panels × nb blocks × P parts × 16 lines.
            unsafe {
                for i in 0..g1 - g0 {
                    let panel = w.bytes.as_ptr().add((g0 + i) * w.panel_bytes);
                    let dst = bufs.w.as_mut_ptr().add(i * nb * P * 16);
                    for b in 0..nb {
                        let blk = panel.add(sec.qs(b));
                        let col = |k: usize| match w.format {
                            PackedFormat::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(k * 32).cast())),
                            _ => _mm512_loadu_ps(blk.add(k * 64).cast()),
                        };
                        for kk in 0..16 {
                            let (ca, cb) = (split::<P>(col(2 * kk)), split::<P>(col(2 * kk + 1)));
                            for q in 0..P {
                                _mm512_store_si512(dst.add((b * P + q) * 16 + kk).cast(), pick(ca[q], cb[q], pairs));
                            }
                        }
                    }
                }
            }
            // Two row tiles at a time meet every panel of the group: their parts stay in L1 and L2 across the
            // group, and the group's split weights in L2 across the rows.
            let mut r0 = 0;
            while r0 < rows {
                let m = ((rows - r0) / TILE_M).min(2);
                let mut p = g0;
                while p < g1 {
                    let n = (g1 - p).min(2);
                    let wp = bufs.w.as_ptr().cast::<u8>().wrapping_add((p - g0) * panel_split);
                    let parts = Parts {
                        x: bufs.x.as_ptr().cast(),
                        x_part: part_lines * 64,
                        w0: wp,
                        w1: wp.wrapping_add(panel_split),
                        w_block: P * 1024,
                    };
                    // SAFETY: rows r0..r0 + 16·m exist in the part buffers; panels p..p + n's B tiles are in `wp`;
                    // the parts are those `P` says.
                    unsafe {
                        match (m, n) {
                            (2, 2) => tiles::<2, 2, P>(nb, &parts, r0),
                            (2, _) => tiles::<2, 1, P>(nb, &parts, r0),
                            (_, 2) => tiles::<1, 2, P>(nb, &parts, r0),
                            _ => tiles::<1, 1, P>(nb, &parts, r0),
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
                    p += n;
                }
                r0 += m * TILE_M;
            }
            g0 = g1;
        }
        // SAFETY: the caller has AMX.
        unsafe { release() };
    });
}

/// Bytes of split weights a group of panels takes (see [`group_panels`]): with the two row tiles that meet them,
/// within the 2 MB L2 of the Xeon it was measured on.
const GROUP_BYTES: usize = 1 << 20;

/// Panels per group of [`run_float`], whose split weights (`panel_bytes` each) every pair of row tiles meets
/// before the next: as many as fit in [`GROUP_BYTES`], an even number from 2 to 16. With two panels per group
/// (all rows past each pair of panels, the parts of every row read again from L3 each time), one thread, 512
/// rows, best G multiply-adds/s of interleaved slices: F32 576×1536 60-70 → 80-88, 1536×576 78-88 → 100-114; F16
/// 576×1536 90-105 → 152-156, 1536×576 159 → 194-202 (groups of 4 to 20 panels within noise of one another).
fn group_panels(panel_bytes: usize) -> usize {
    (GROUP_BYTES / panel_bytes / 2 * 2).clamp(2, 16)
}

/// Where [`tiles`] finds its operands: the activations' parts (part `q`'s row tile `t`, block `b` as 1 KB at
/// `q·x_part + 1024·(t·nb + b)`), and two panels' B tiles (block `b`'s part `q` at `w_block·b + 1024·q`). Every
/// tile is 1 KB in one piece, so that a tile load reads whole lines in order: with the A tiles' rows a row of the
/// matrix apart, the loads were most of the kernel's time.
struct Parts {
    x: *const u8,
    x_part: usize,
    w0: *const u8,
    w1: *const u8,
    w_block: usize,
}

/// The C tiles of `M` row tiles (from row `r0`) × `N` panels: `tmm4 + 2t + i` for row tile `t`, panel `i`.
/// Each block is one step per entry of [`steps`], and each step the 2 × 2 pattern of a tiled matrix product: four
/// products of two A and two B tiles. A step reloads only the operand whose part differs from the step before
/// (for F16, 8 loads per block instead of 12: one thread, 512 rows, median G multiply-adds/s of interleaved slices:
/// 1536×576 107 → 129 and 132 → 145, 576×1536 96 → 105; the tile loads here cost about as much as the products).
/// Every tile feeds two products, so a load waits only for the first of them to finish with the register it
/// refills, and the unit stays busy (with a single C tile per panel, each A load waited for the products before
/// it: perf put the samples on the loads).
///
/// # Safety
/// The configuration is loaded; the part buffers hold the rows, `w0` (and `w1` when `N` = 2) the panels' blocks,
/// with `P` parts each.
#[inline(always)]
unsafe fn tiles<const M: usize, const N: usize, const P: usize>(nb: usize, x: &Parts, r0: usize) {
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
            let mut last = (usize::MAX, usize::MAX);
            for &(xq, wq) in steps::<P>() {
                if xq != last.0 {
                    let xs = x.x.add(xq * x.x_part + a);
                    load::<0>(xs, 64);
                    if M > 1 {
                        load::<1>(xs.add(tile), 64);
                    }
                }
                if wq != last.1 {
                    let ws = x.w_block * b + 1024 * wq;
                    load::<2>(x.w0.add(ws), 64);
                    if N > 1 {
                        load::<3>(x.w1.add(ws), 64);
                    }
                }
                last = (xq, wq);
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
