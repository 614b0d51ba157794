//! AMX int8 tiles for the quantized panels' prefill and batches (`tdpbsud`), in the `amx` level's `packed` entry.
//!
//! A panel block unpacked to bytes ([`packed512::unpack_group`]: line `j` holds weights `4j..4j + 4` of the 16
//! rows) is exactly the B operand `tdpbsud` wants, 8 lines for a 32-weight block (Q8's blocks are that already,
//! in the panel). The A operand is 16 activation rows of one block. One tile product forms the 16 × 16 integer
//! dot products of a block for which the 512-bit kernel runs 128 `vpdpbusd`.
//!
//! Each block has scales of its own per weight row and per activation row, so each block's 16 × 16 sums leave
//! the tile unit for a float epilogue on the vector pipes, in exactly the order [`crate::packed::panel_ref`]
//! states: the results are bit-identical to the reference and to the 512-bit kernel (the kernel tests compare
//! them bit for bit at every level). The products of the next row tile run while the epilogue of the one before
//! reads its stored sums (two sets of result buffers).
//!
//! The activations of a chunk of rows are first copied into tile order (each A tile's 16 rows of one block, 512
//! bytes in one piece), so that a tile load reads whole lines in order; a B tile is one unpacked block, 512 bytes.
//!
//! Measured on a Xeon with AMX (one thread, 512 Q8x2 rows, median G weight-MAC/s of interleaved slices, 512-bit
//! kernel → tiles): Q4_0 1536×576 60 → 87, Q4_1 576×1536 46 → 58, Q5_0 2048×640 80 → 96, Q8_0 1536×576 47 → 64.
//! The tile unit and the epilogue do not overlap as well as hoped: the products and stores alone ran at about
//! 200 G, the epilogue alone at about 200 G, the two together at about 90 G. The order that helped most (1.46×
//! against 1.1× for Q4_0) issues a block's products, then the previous block's epilogue, then the block's stores.
//! Keeping a slab of blocks in L1 while all row tiles meet it measured no different from whole rows.
//!
//! A later microbenchmark put the limit on the tile side, not on the vector pipes: 32 independent vector operations
//! (adds, conversions, shifts or fused multiply-adds) beside four products cost 1–4 TSC ticks more than the products
//! alone (~116–120 per four, K = 32), but loading the four operand tiles, the products and the stores in a row took
//! ~236: tile registers appear not to be renamed, so a tile load waits for the products that still read the register.
//! So [`blocks`] goes block by block: a block's two B tiles are loaded once for the chunk's four row tiles, and the row
//! tiles' A tiles alternate between `tmm0` and `tmm1` (their products between `tmm4`/`tmm5` and `tmm6`/`tmm7`), so that
//! the next row tile's A load does not wait on the products in flight. One tile load per two products instead of one
//! per product. One thread, 512 Q8x2 rows, best G weight-MAC/s of 12 interleaved slices, old order → this one, two
//! pairs per shape on a loaded host: Q4_0 1536×576 73.5 → 87.2, 61.0 → 67.8; 576×1536 82.0 → 82.6, 94.1 → 97.4; Q4_1
//! 576×1536 93.3 → 106.0, 87.4 → 110.8; Q8_0 1536×576 90.7 → 114.0, 106.1 → 108.8; Q5_0 2048×640 91.5 → 108.2, 91.3 →
//! 101.6; 640×2048 93.0 → 97.0, 69.7 → 70.3 (medians, stuck near 60 while the host ran at half speed, moved neither
//! way; an earlier, quieter run gave Q4_0 medians 94 → 105 and 93 → 110, and a third 86 → 77 with bests 97 → 117).
//!
//! Tiles (palette 1): `tmm0`, `tmm1` the A tiles of alternate row tiles (16 activation rows each), `tmm2`, `tmm3`
//! two panels' blocks (B), `tmm4`, `tmm5` and `tmm6`, `tmm7` the products of alternate row tiles. Fewer than 16
//! rows, and the rows past a multiple of 16, go to the 512-bit kernel: decode never comes here.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::amx::{self, TILE_M, TileConfig, load, store, zero};
use super::packed512::{self, Q4, Q5, Q8, Quants, UNPACKED_BLOCK};
use crate::dispatch::{Act32, OutSink};
use crate::packed::{Line, PANEL_ROWS, PackedFormat, PackedView, Sections, check_args};

/// Activation rows copied into tile order at a time, and met by every panel pair of the task before the next.
const CHUNK: usize = 64;

/// Bytes between the two sets of C tiles (two each). Not 4 KB, which would put each line of one set at the same address
/// modulo 4 KB as the other's, where the epilogue's loads of one set could be taken to depend on the tile stores
/// into the other (loads are matched to earlier stores by their low 12 address bits first). A precaution: the
/// difference was within this host's noise.
const SET_BYTES: usize = 4096 + 1024 + 512;

/// `C = A · B` over signed A bytes and unsigned B bytes, in i32 (C zeroed first).
///
/// # Safety
/// The configuration is loaded and tiles `A` and `B` hold data.
#[inline(always)]
unsafe fn product<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's contract; tile instructions touch no memory here.
    unsafe {
        zero::<C>();
        asm!("tdpbsud tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem))
    }
}

/// A thread's buffers, grown to the largest call seen and reused.
#[derive(Default)]
struct Buffers {
    /// The chunk's activations in tile order: row tile `t`, block `b` at line `(t·nb + b)·8`, 16 rows of 32 bytes.
    a: Vec<Line>,
    /// Per output row of the chunk and block: the integer term that takes the weights' offset back out,
    /// `−offset · Σq` (Q8x2 pairs as `256·Σq₁ + Σq₂`), at `o·nb + b`.
    offs: Vec<i32>,
    /// A panel pair's blocks unpacked (see [`packed512::unpack_group`]).
    b: Vec<Line>,
    /// Two sets of two C tiles.
    c: Vec<Line>,
    /// f32 accumulators: output row `o` of the chunk, panel `i` at line `2·o + i`.
    acc: Vec<Line>,
}

thread_local! {
    static BUFFERS: RefCell<Option<Buffers>> = const { RefCell::new(None) };
}

/// The [`crate::dispatch::PanelPacked`] kernel of the `amx` level: whole tiles of 16 activation rows on the tile
/// unit, the rest on the 512-bit kernel.
///
/// # Safety
/// [`super::amx::supported`] returned true, and the CPU has AVX-512 F, BW, VL and VNNI plus F16C and FMA.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel(
    w: PackedView<'_>,
    panels: Range<usize>,
    act: Act32<'_>,
    n_act: usize,
    group: usize,
    out: &OutSink<'_>,
) {
    check_args(&w, &panels, &act, n_act, group);
    // The K-quants stay on the 512-bit kernel: it keeps their widened scales across tiles, and on the tile unit
    // K6's half blocks double the stores and epilogues (one thread, 512 Q8x2 rows, median G weight-MAC/s: Q6_K
    // 640×2048 35 on the vector pipes against 22 on tiles, Q4_K 640×1024 78 against 66).
    let on_tiles = matches!(w.format, PackedFormat::Q4 | PackedFormat::Q5 | PackedFormat::Q8);
    let tiled = if panels.is_empty() || !on_tiles { 0 } else { n_act / TILE_M * TILE_M };
    if tiled > 0 {
        // SAFETY (all): the arguments were checked; `tiled` rows exist; the caller has AMX and the features.
        unsafe {
            match (w.format, group) {
                (PackedFormat::Q4, 1) => run::<Q4, 1>(&w, panels.clone(), &act, tiled, out),
                (PackedFormat::Q4, _) => run::<Q4, 2>(&w, panels.clone(), &act, tiled, out),
                (PackedFormat::Q5, 1) => run::<Q5, 1>(&w, panels.clone(), &act, tiled, out),
                (PackedFormat::Q5, _) => run::<Q5, 2>(&w, panels.clone(), &act, tiled, out),
                (PackedFormat::Q8, 1) => run::<Q8, 1>(&w, panels.clone(), &act, tiled, out),
                (PackedFormat::Q8, _) => run::<Q8, 2>(&w, panels.clone(), &act, tiled, out),
                _ => unreachable!("only the 32-weight formats go on tiles"),
            }
        }
    }
    if tiled < n_act {
        let nb = w.nb;
        let tail = Act32 {
            qs: &act.qs[tiled * nb * 32..],
            d: &act.d[tiled * nb..],
            s: &act.s[tiled * nb..],
            isum: &act.isum[tiled * nb..],
        };
        // SAFETY: the caller has the features; the tail is the rest of the checked rows, in whole groups (16 is
        // a multiple of the group).
        unsafe { packed512::panel(w, panels, tail, n_act - tiled, group, &out.rows_from(tiled / group)) };
    }
}

/// Activation rows `0..rows` (a multiple of 16) against `panels`, [`CHUNK`] rows at a time.
///
/// # Safety
/// As [`panel`], with `rows` ≤ the checked rows, a multiple of 16.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<F: Quants, const G: usize>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    act: &Act32<'_>,
    rows: usize,
    out: &OutSink<'_>,
) {
    let nb = w.nb;
    let off = F::FORMAT.offset();
    // A tiles of 16 rows × one block's 32 bytes, B tiles of one block's 8 lines.
    // SAFETY: the caller has AMX.
    unsafe { TileConfig::shaped(32, 8).load() };
    BUFFERS.with_borrow_mut(|bufs| {
        let bufs = bufs.get_or_insert_with(Buffers::default);
        let grow = |v: &mut Vec<Line>, n: usize| {
            if v.len() < n {
                v.resize(n, Line([0; 64]));
            }
        };
        grow(&mut bufs.a, CHUNK * nb / 2);
        grow(&mut bufs.c, 2 * SET_BYTES / 64);
        grow(&mut bufs.acc, 2 * CHUNK);
        for c0 in (0..rows).step_by(CHUNK) {
            let chunk = c0..(c0 + CHUNK).min(rows);
            // Tile order: line pair of row r, block b of tile t at (t·nb + b)·8 lines + 32·r bytes.
            let a = bufs.a.as_mut_ptr().cast::<u8>();
            for r in chunk.clone() {
                let local = r - c0;
                let (t, rr) = (local / TILE_M, local % TILE_M);
                for b in 0..nb {
                    let src = &act.qs[(r * nb + b) * 32..(r * nb + b) * 32 + 32];
                    // SAFETY: the buffer holds CHUNK·nb blocks of 32 bytes per row.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src.as_ptr().cast::<u8>(),
                            a.add((t * nb + b) * 512 + 32 * rr),
                            32,
                        )
                    };
                }
            }
            bufs.offs.clear();
            if off != 0 {
                for o in chunk.start / G..chunk.end / G {
                    for b in 0..nb {
                        let sum = (0..G)
                            .fold(0i32, |sum, g| sum.wrapping_mul(256).wrapping_add(act.isum[(o * G + g) * nb + b]));
                        bufs.offs.push((-off).wrapping_mul(sum));
                    }
                }
            }
            let mut p = panels.start;
            while p < panels.end {
                let n = (panels.end - p).min(2);
                // B tile of panel p + i, block b at `bq[i] + b·stride`.
                let (bq, stride): ([*const u8; 2], usize) = if F::FORMAT == PackedFormat::Q8 {
                    // Q8's blocks are B tiles as they lie in the panel (stride 0 tells `blocks` so).
                    ([std::ptr::null(); 2], 0)
                } else if n == 2 {
                    // SAFETY: panels p, p + 1 are checked ones.
                    (unsafe { packed512::unpack_group::<F, 2>(w, p, &mut bufs.b) }, UNPACKED_BLOCK)
                } else {
                    // SAFETY: panel p is a checked one.
                    let [one] = unsafe { packed512::unpack_group::<F, 1>(w, p, &mut bufs.b) };
                    ([one, one], UNPACKED_BLOCK)
                };
                let outs = chunk.len() / G;
                let acc = bufs.acc.as_mut_ptr().cast::<f32>();
                // SAFETY: the accumulators hold 2 panels × CHUNK rows of 16 f32.
                unsafe {
                    for i in 0..2 * outs {
                        _mm512_store_ps(acc.add(16 * i), _mm512_setzero_ps());
                    }
                }
                let tiles = chunk.len() / TILE_M;
                // SAFETY: panels p..p + n and the chunk's row tiles exist, and the accumulators hold them.
                unsafe {
                    if n == 2 {
                        blocks::<F, G, 2>(w, p, bq, stride, act, c0, tiles, bufs, acc)
                    } else {
                        blocks::<F, G, 1>(w, p, bq, stride, act, c0, tiles, bufs, acc)
                    }
                }
                for o in 0..outs {
                    for i in 0..n {
                        // SAFETY: output o's accumulators of panel i, within the buffer.
                        let lanes = unsafe { std::slice::from_raw_parts(acc.add(16 * (2 * o + i)), PANEL_ROWS) };
                        out.put_row(c0 / G + o, (p + i) * PANEL_ROWS, lanes);
                    }
                }
                p += n;
            }
        }
    });
    // SAFETY: the caller has AMX.
    unsafe { amx::release() };
}

/// Panels `p..p + N` against every row tile of the chunk, block by block: each block's B tiles are loaded once
/// for all the chunk's row tiles, whose A tiles alternate between two tile registers (and their products between
/// two sets of C tiles), so that a row tile's A load need not wait for the products that read the other.
///
/// # Safety
/// As [`run`]: row tiles `0..tiles` of the chunk at `c0` exist in `bufs.a` and their accumulators at `acc`,
/// `p + N` ≤ `w.n_panels`, the configuration is loaded, and panel `p + i`'s block `b` is a B tile at
/// `bq[i] + b·stride` (or, with `stride` 0, at its quants in the panel).
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn blocks<F: Quants, const G: usize, const N: usize>(
    w: &PackedView<'_>,
    p: usize,
    bq: [*const u8; 2],
    stride: usize,
    act: &Act32<'_>,
    c0: usize,
    tiles: usize,
    bufs: &mut Buffers,
    acc: *mut f32,
) {
    let nb = w.nb;
    let sec = Sections::of(F::FORMAT, nb);
    // SAFETY: every pointer stays inside the buffers (sized in `run`), panels p..p + N, and the chunk's rows.
    unsafe {
        let offs = bufs.offs.as_ptr();
        let a = bufs.a.as_ptr().cast::<u8>();
        let c = bufs.c.as_mut_ptr().cast::<u8>();
        let base: [*const u8; N] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        // Item k (row tile t, block b) has its sums in result set k % 2; its epilogue runs while item k + 1's
        // products do.
        let scale = |(t, b, k): (usize, usize, usize)| {
            let acc = acc.add(16 * 2 * (t * TILE_M / G));
            epilogue::<F, G, N>(&base, &sec, nb, act, c0, t, offs, c.add((k % 2) * SET_BYTES), acc, b);
        };
        let mut prev = None;
        let mut k = 0;
        for b in 0..nb {
            let bt = |i: usize| if stride == 0 { base[i.min(N - 1)].add(sec.qs(b)) } else { bq[i].add(b * stride) };
            load::<2>(bt(0), 64);
            if N == 2 {
                load::<3>(bt(1), 64);
            }
            for t in 0..tiles {
                let at = a.add((t * nb + b) * 512);
                let set = c.add((k % 2) * SET_BYTES);
                if k % 2 == 0 {
                    row_tile::<0, 4, 5, N>(at, || prev.map_or((), scale), set);
                } else {
                    row_tile::<1, 6, 7, N>(at, || prev.map_or((), scale), set);
                }
                prev = Some((t, b, k));
                k += 1;
            }
        }
        if let Some(item) = prev {
            scale(item);
        }
    }
}

/// One row tile of [`blocks`] on tile registers `A` (its A tile, loaded from `at`) and `C0`, `C1` (its products
/// with the B tiles in `tmm2` and, for `N` = 2, `tmm3`): the products, then `between` (the previous row tile's
/// epilogue, which runs while they do), then the products' stores to `set`.
///
/// # Safety
/// As [`blocks`]: `at` holds an A tile, the B tiles are loaded, and `set` has room for `N` C tiles.
#[inline(always)]
unsafe fn row_tile<const A: u8, const C0: u8, const C1: u8, const N: usize>(
    at: *const u8,
    between: impl FnOnce(),
    set: *mut u8,
) {
    // SAFETY: the caller's contract.
    unsafe {
        load::<A>(at, 32);
        product::<C0, A, 2>();
        if N == 2 {
            product::<C1, A, 3>();
        }
        between();
        store::<C0>(set);
        if N == 2 {
            store::<C1>(set.add(1024));
        }
    }
}

/// Scales the sums of row tile `t` and block `b`, stored in the result set at `set`, into the row tile's
/// accumulators at `acc`, in the order of [`crate::packed::panel_ref`]: the integer sum (Q8x2 pairs as
/// `256·i₁ + i₂`) less the offset term, times `scale · d`, added with one fused multiply-add; then the offset term
/// `m · s` of formats with one.
///
/// # Safety
/// As [`blocks`], whose products of that tile and block are in the set; `offs` as in [`Buffers`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue<F: Quants, const G: usize, const N: usize>(
    base: &[*const u8; N],
    sec: &Sections,
    nb: usize,
    act: &Act32<'_>,
    c0: usize,
    t: usize,
    offs: *const i32,
    set: *const u8,
    acc: *mut f32,
    b: usize,
) {
    let off = F::FORMAT.offset();
    // SAFETY: the caller's contract: block b's scales in each panel, the chunk's activation rows, the buffers.
    unsafe {
        let sv: [[__m512; 2]; N] = std::array::from_fn(|i| F::scales(base[i], sec, b));
        // Output row o's scalars, a pointer step per row: d of its last activation row, s of its first, and
        // its offset term.
        let row0 = c0 + t * TILE_M;
        let mut d = act.d.as_ptr().add((row0 + G - 1) * nb + b);
        let mut s = act.s.as_ptr().add(row0 * nb + b);
        let mut of = offs.wrapping_add((row0 - c0) / G * nb + b);
        let mut line = set.cast::<i32>();
        let mut ap = acc;
        for _ in 0..TILE_M / G {
            let (da, sa) = (_mm512_set1_ps(*d), _mm512_set1_ps(*s));
            let init = if off != 0 { _mm512_set1_epi32(*of) } else { _mm512_setzero_si512() };
            for i in 0..N {
                let tile = line.add(256 * i);
                let mut iv = if G == 2 {
                    _mm512_add_epi32(
                        _mm512_slli_epi32(_mm512_load_si512(tile.cast()), 8),
                        _mm512_load_si512(tile.add(16).cast()),
                    )
                } else {
                    _mm512_load_si512(tile.cast())
                };
                if off != 0 {
                    iv = _mm512_add_epi32(iv, init);
                }
                let scale = _mm512_mul_ps(sv[i][0], da);
                let a = ap.add(16 * i);
                let mut v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), scale, _mm512_load_ps(a));
                if F::FORMAT.has_min() {
                    v = _mm512_fmadd_ps(sv[i][1], sa, v);
                }
                _mm512_store_ps(a, v);
            }
            d = d.add(G * nb);
            s = s.add(G * nb);
            of = of.wrapping_add(nb);
            line = line.add(16 * G);
            ap = ap.add(32);
        }
    }
}
