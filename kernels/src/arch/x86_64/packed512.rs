//! The AVX-512 VNNI kernel for 16-row panels ([`crate::packed`]): every 512-bit register holds one value per
//! panel row, so a `vpdpbusd` with four activation bytes broadcast from memory advances 16 dot products at once.
//!
//! A tile is `P` panels (two when two remain; one in decode) × `C` output rows. Per block it unpacks each panel's quants once, a
//! pair of weight groups at a time (registers of 16 rows × 4 weights), broadcasts each group of four activation
//! bytes once for all `P` panels, runs 8 (Q8x2: 16) `vpdpbusd` per panel and output row, then a float epilogue of
//! 16 lanes with the block's scales (and offsets). The order of operations per output element is the one
//! [`crate::packed::panel_ref`] states, whatever `P` and `C` are, so results do not depend on the batch or the
//! tiling.
//!
//! A batch with more than one tile per panel group unpacks the group's quants once into a per-thread buffer of
//! bytes ([`unpack_group`]) that every tile then loads, rather than unpacking them in every tile.
//!
//! The K-quant panels (K4 from Q4_K, K6 from Q6_K) run the same tile, Q8x2 fused as for the others: a block's
//! scale is the super-block's f16 `d` times the block's integer scale, formed in f32 per block (or once per call
//! in the scale cache). K6 has a scale per half block, so its two halves' integer sums stay apart (weight groups
//! `jj` and `jj + 4` are the two halves), each less its own `32·Σq`, with the half blocks' Σq of the
//! activations summed once per chunk of rows.

use std::arch::x86_64::*;
use std::cell::Cell;
use std::ops::Range;

use super::cache::{DecodeStream, L2_NEAR_AHEAD, decode_stream, small_l1d};
use super::packed256::{DECODE_F, prefetch_l2, prefetch_lines, prefetch_streams};
use crate::dispatch::{Act32, OutSink};
use crate::packed::{Line, PANEL_ROWS, PackedFormat, PackedView, Sections, check_args, check_args_f};

/// Output rows sharing one unpack of a block of `panels` panels, by activation group: the P·C·G integer
/// accumulators, P·C float accumulators, the unpacked weight pairs and the scales must fit in 32 zmm registers.
/// Two panels of Q8x2 pairs take 3 rows (12 + 6 accumulators, 28 registers in all; 4 rows spill).
/// A format with a scale per half block (K6) keeps two integer sums per pair, so fewer rows fit.
const fn tile_rows(group: usize, panels: usize, halves: bool) -> usize {
    match (group, panels, halves) {
        (1, 1, false) => 8,
        (2, 1, _) | (1, _, false) | (1, 1, true) => 4,
        (2, 2, false) | (1, 2, true) => 3,
        _ => 2,
    }
}

/// Output rows whose activations stay in L1/L2 while all of a task's panels pass (as in the GGUF-layout kernels).
pub(crate) const ACT_CHUNK: usize = 64;

/// The format-specific part of a tile: how a block's quants become registers of unsigned bytes, a pair at a
/// time (weight groups `jj` and `jj + 4`, which share a nibble chunk in the 4-bit formats).
pub(super) trait Quants {
    const FORMAT: PackedFormat;
    /// Most blocks (panels × blocks per row) of a panel group that a batch unpacks once per chunk of rows
    /// ([`unpack_group`]) rather than once per tile: 48 (24 KB, which stays in L1 beside the activations) where
    /// unpacking is a few operations per pair, none for Q8 (its pairs are two loads), no limit for Q5, whose
    /// unpacking costs more than reading the unpacked bytes back from L2.
    const PRE_BLOCKS: usize = 48;
    /// Whatever the pairs need from the block besides their chunk (Q5's high bits), loaded once per block.
    ///
    /// # Safety
    /// `qs` must point to one block's `FORMAT.qs_bytes()` bytes, 64-byte aligned; the CPU must have AVX-512 F/BW.
    unsafe fn extra(_qs: *const u8) -> __m512i {
        // SAFETY: the caller has the features.
        unsafe { _mm512_setzero_si512() }
    }
    /// Weight groups `jj` and `jj + 4` (`jj` < 4) of the block: for each of the 16 rows, four unsigned bytes.
    ///
    /// # Safety
    /// As [`Quants::extra`]; `extra` is what it returned for this block.
    unsafe fn unpack_pair(qs: *const u8, jj: usize, extra: __m512i) -> [__m512i; 2];
    /// Block `b`'s scales for the 16 rows of the panel at `panel`, as [`crate::packed::PackedView::scale`] and
    /// `m` state them: the scale of weights 0..16, then the offset (formats with one) or the scale of weights
    /// 16..32 (formats with a scale per half block); zero where the format has neither.
    ///
    /// # Safety
    /// `panel` must be a checked panel with sections `sec`, `b` one of its blocks; the CPU must have AVX-512 F.
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize) -> [__m512; 2] {
        // SAFETY: a line of 16 f16 scales (and offsets) per block, 32-byte aligned, by the caller's contract.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_load_si256(panel.add(sec.d(b)).cast()));
            let m = if Self::FORMAT.has_min() {
                _mm512_cvtph_ps(_mm256_load_si256(panel.add(sec.m(b)).cast()))
            } else {
                _mm512_setzero_ps()
            };
            [d, m]
        }
    }
}

/// Sixteen integer scales (bytes, zero- or sign-extended) as f32.
///
/// # Safety
/// Sixteen bytes must be readable at `p`, 16-byte aligned; the CPU must have AVX-512 F.
#[inline(always)]
unsafe fn scale16<const SIGNED: bool>(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm_load_si128(p.cast());
        _mm512_cvtepi32_ps(if SIGNED { _mm512_cvtepi8_epi32(v) } else { _mm512_cvtepu8_epi32(v) })
    }
}

/// A K format's f16 super-block scale line (at byte `at` of the panel), as f32.
///
/// # Safety
/// As [`Quants::scales`]; `at` is a line of the panel's [`Sections`].
#[inline(always)]
unsafe fn super_scale(panel: *const u8, at: usize) -> __m512 {
    // SAFETY: the caller's contract: one 32-byte aligned line of 16 f16.
    unsafe { _mm512_cvtph_ps(_mm256_load_si256(panel.add(at).cast())) }
}

pub(super) struct Q4;
pub(super) struct Q5;
pub(super) struct Q8;
pub(super) struct K4;
pub(super) struct K6;

impl Quants for Q4 {
    const FORMAT: PackedFormat = PackedFormat::Q4;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m512i) -> [__m512i; 2] {
        // SAFETY: the caller guarantees the block's 256 aligned bytes and the features.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let v = _mm512_load_si512(qs.add(64 * jj).cast());
            [_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask)]
        }
    }
}

impl Quants for Q5 {
    const FORMAT: PackedFormat = PackedFormat::Q5;
    const PRE_BLOCKS: usize = usize::MAX;
    #[inline(always)]
    unsafe fn extra(qs: *const u8) -> __m512i {
        // SAFETY: the caller guarantees the block's 320 aligned bytes and the features.
        unsafe { _mm512_load_si512(qs.add(256).cast()) }
    }
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, qh: __m512i) -> [__m512i; 2] {
        // SAFETY: as for Q4; the high bits come from `qh`.
        unsafe {
            let mut u = Q4::unpack_pair(qs, jj, qh);
            // `vpshufb` indexes bytes within each 128-bit lane: dword w of a lane starts at byte 4w.
            let (a, b, c) = (0x0404_0404, 0x0808_0808, 0x0C0C_0C0C);
            let dword_base = _mm512_set_epi32(c, b, a, 0, c, b, a, 0, c, b, a, 0, c, b, a, 0);
            for (half, uj) in u.iter_mut().enumerate() {
                // The group's weights start at bit s of the row's qh: byte s/8 holds their four bits at s%8.. .
                let s = 4 * jj + 16 * half;
                // Copy that byte of each row's dword to all four of its bytes (the shuffle stays within
                // 128-bit lanes, as each dword does), test one bit per byte, and add 16 where it is set.
                let spread = _mm512_shuffle_epi8(qh, _mm512_add_epi8(dword_base, _mm512_set1_epi8((s / 8) as i8)));
                let hit = _mm512_test_epi8_mask(spread, _mm512_set1_epi32(BITS[(s % 8) / 4]));
                *uj = _mm512_mask_add_epi8(*uj, hit, *uj, _mm512_set1_epi8(16));
            }
            u
        }
    }
}

/// Per-byte test masks: bit `i` (or `4 + i`) in byte `i`.
const BITS: [i32; 2] = [0x0804_0201, 0x8040_2010_u32 as i32];

impl Quants for Q8 {
    const FORMAT: PackedFormat = PackedFormat::Q8;
    const PRE_BLOCKS: usize = 0;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m512i) -> [__m512i; 2] {
        // SAFETY: the caller guarantees the block's 512 aligned bytes and the features.
        unsafe { [_mm512_load_si512(qs.add(64 * jj).cast()), _mm512_load_si512(qs.add(64 * (jj + 4)).cast())] }
    }
}

impl Quants for K4 {
    const FORMAT: PackedFormat = PackedFormat::K4;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, extra: __m512i) -> [__m512i; 2] {
        // SAFETY: the same nibble chunks as Q4.
        unsafe { Q4::unpack_pair(qs, jj, extra) }
    }
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize) -> [__m512; 2] {
        // SAFETY: the super-block lines and the 16-byte lines of block b's integer scales and mins, by the
        // caller's contract.
        unsafe {
            let d = _mm512_mul_ps(super_scale(panel, sec.d(b)), scale16::<false>(panel.add(sec.sc(b))));
            let m = _mm512_mul_ps(super_scale(panel, sec.m(b)), scale16::<false>(panel.add(sec.mn(b))));
            // −(dmin·mn), negated exactly (a sign flip, as the reference's unary minus). An integer xor of the sign
            // bit: `_mm512_xor_ps` is AVX-512 DQ, which this level does not enable, so it was an out-of-line call
            // per block.
            let sign = _mm512_set1_epi32(i32::MIN);
            [d, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), sign))]
        }
    }
}

impl Quants for K6 {
    const FORMAT: PackedFormat = PackedFormat::K6;
    /// No limit, as for Q5: merging each pair's bit pairs into its nibbles takes six vector operations, and a
    /// K6 tile holds only two output rows (its halves' sums stay apart), so a chunk has 16 tiles that each paid
    /// them again. One thread, Q8x2, 512 output rows, 640×2048 (Gemma 3's FFN-down, 64 KB unpacked, more than
    /// L1), best G weight-MAC/s of 12 interleaved slices, per tile → per chunk, 8 pairs from three runs on the AMX
    /// Xeon: 49.8 → 57.5, 50.1 → 62.8, 54.3 → 64.9, 55.2 → 63.0, 52.5 → 62.4, 54.7 → 62.9, 59.2 → 70.0,
    /// 61.6 → 69.2 (+13–25%; an earlier session measured 33 → 31–32 by medians on a busier host).
    const PRE_BLOCKS: usize = usize::MAX;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m512i) -> [__m512i; 2] {
        // SAFETY: the nibble chunk jj and the bit-pair chunk 4 + jj/2 of the block, by the caller's contract.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let top = _mm512_set1_epi8(0x30);
            let v = _mm512_load_si512(qs.add(64 * jj).cast());
            let h = _mm512_load_si512(qs.add(64 * (4 + jj / 2)).cast());
            // This chunk's bit pairs sit at bits 0..4 (even jj) or 4..8 (odd jj) of each byte, the low nibbles'
            // first: move each pair to bits 4..6 (16-bit shifts; the mask drops what crosses a byte).
            let (hl, hh) = if jj.is_multiple_of(2) {
                (_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2))
            } else {
                (h, _mm512_srli_epi16(h, 2))
            };
            // low | (h & 0x30) in one ternary-logic op each (truth table a | (b & c) = 0xF8).
            [
                _mm512_ternarylogic_epi32::<0xF8>(_mm512_and_si512(v, low), hl, top),
                _mm512_ternarylogic_epi32::<0xF8>(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), hh, top),
            ]
        }
    }
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize) -> [__m512; 2] {
        // SAFETY: the super-block line and the two 16-byte lines of block b's half-block scales, by the
        // caller's contract.
        unsafe {
            let d = super_scale(panel, sec.d(b));
            let sc = |part: usize| scale16::<true>(panel.add(sec.sc(b) + 16 * part));
            [_mm512_mul_ps(d, sc(0)), _mm512_mul_ps(d, sc(1))]
        }
    }
}

/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI plus F16C and FMA.
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
    // SAFETY (all ten): the arguments were checked above and the caller has the features.
    unsafe {
        match (w.format, group) {
            (PackedFormat::Q4, 1) => run::<Q4, 1>(&w, panels, &act, n_act, out),
            (PackedFormat::Q4, _) => run::<Q4, 2>(&w, panels, &act, n_act / 2, out),
            (PackedFormat::Q5, 1) => run::<Q5, 1>(&w, panels, &act, n_act, out),
            (PackedFormat::Q5, _) => run::<Q5, 2>(&w, panels, &act, n_act / 2, out),
            (PackedFormat::Q8, 1) => run::<Q8, 1>(&w, panels, &act, n_act, out),
            (PackedFormat::Q8, _) => run::<Q8, 2>(&w, panels, &act, n_act / 2, out),
            (PackedFormat::K4, 1) => run::<K4, 1>(&w, panels, &act, n_act, out),
            (PackedFormat::K4, _) => run::<K4, 2>(&w, panels, &act, n_act / 2, out),
            (PackedFormat::K6, 1) => run::<K6, 1>(&w, panels, &act, n_act, out),
            (PackedFormat::K6, _) => run::<K6, 2>(&w, panels, &act, n_act / 2, out),
            (PackedFormat::F32 | PackedFormat::F16, _) => unreachable!("check_args refuses float panels"),
        }
    }
}

/// # Safety
/// As [`panel`], with its arguments checked by [`check_args`]; `n_out` output rows of `G` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<F: Quants, const G: usize>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    act: &Act32<'_>,
    n_out: usize,
    out: &OutSink<'_>,
) {
    let chunk = ACT_CHUNK / G;
    let mut halves = HALF_SUMS.take();
    let mut unpacked = UNPACKED.take();
    // Where a decode chunk's stream goes, and how far ahead (see `DecodeStream`): read once per call, not per chunk.
    let how = decode_stream();
    let mut o0 = 0;
    while o0 < n_out {
        let o1 = (o0 + chunk).min(n_out);
        let act = &Acts::new(act, w.nb, o0 * G..o1 * G, F::FORMAT.split_halves(), &mut halves);
        let mut p = panels.start;
        let decode = o1 - o0 == 1;
        // The end of the task's panels, where a decode stream's prefetch stops (later panels are another task's).
        let end = w.bytes.as_ptr().wrapping_add(panels.end * w.panel_bytes);
        if decode {
            // Decode: the first `ahead` bytes of the task are fetched here; each block then fetches its own lines
            // that far ahead (see `tile`).
            let first = w.bytes.as_ptr().wrapping_add(p * w.panel_bytes);
            stream_hint(how, first, 0..stream_lines(first, stream_ahead(how), end));
        }
        // Decode runs one panel per tile: with two, the two panels in use and the two being fetched overflowed L1
        // (4 × 26 KB for the Q8 FFN-down panels of SmolLM2); one panel per tile measured faster for Q4_1 and Q8_0.
        let most = if decode { 1 } else { 2 };
        while p < panels.end {
            let n = (panels.end - p).min(most);
            // Batches: the panels this group's tiles fetch as they go, the next group.
            let from = p + n;
            let lines = panels.end.saturating_sub(from).min(most) * w.panel_bytes / 64;
            let next = if decode { Ahead::Stream { end, how } } else { Ahead::Group { from, lines } };
            // SAFETY (both): p + n ≤ panels.end; the rest is the caller's.
            if n == 2 {
                unsafe { rows::<F, G, 2>(w, p, act, o0..o1, next, &mut unpacked, out) };
            } else {
                unsafe { rows::<F, G, 1>(w, p, act, o0..o1, next, &mut unpacked, out) };
            }
            p += n;
        }
        o0 = o1;
    }
    HALF_SUMS.set(halves);
    UNPACKED.set(unpacked);
}

thread_local! {
    /// Each thread's buffer of half-block activation sums ([`Acts`]), grown to the largest chunk seen and reused.
    static HALF_SUMS: Cell<Vec<i32>> = const { Cell::new(Vec::new()) };
    /// Each thread's buffer of a panel group's unpacked quants ([`unpack_group`]), grown to the largest group seen.
    static UNPACKED: Cell<Vec<Line>> = const { Cell::new(Vec::new()) };
}

/// Bytes of one block of one panel once unpacked: its eight weight groups, 16 rows × 4 bytes each.
pub(super) const UNPACKED_BLOCK: usize = 8 * 64;

/// Unpacks every block of panels `p..p + P` into `buf` as [`Quants::unpack_pair`] returns them: panel `i`, block
/// `b`, weight group `j` at `(i·nb + b)·512 + 64·j`. A batch's tiles then load their weight registers instead of
/// unpacking them again in every tile (a chunk of 32 Q8x2 output rows is ~11 tiles). Q5's high bits alone take
/// eight vector operations per pair, on the same two ports that run `vpdpbusd` when 512-bit work is in flight
/// on Intel (0 and 5).
///
/// One thread, Intel Xeon (AMX host), Q8x2, 512 output rows, in weight-MACs/s, median of 12 interleaved slices
/// per side, per-tile → per-chunk unpacking: Q5_0 2048×640 38–59 → 48–78 G (+25–33%), 640×2048 40–41 → 47 G;
/// Q6_K 640×512 31–33 → 37 G, and 640×2048 (64 KB unpacked, more than L1) 33 → 31–32 G then, +13–25% later
/// (see `K6`); Q4_0 2048×640 41 → 49
/// G, 1536×576 56–60 → 59–60 G; Q4_K 640×512 77 → 80 G; Q4_1 576×1536 (48 KB) 75–77 → 70–72 G. Hence the
/// limits of [`Quants::PRE_BLOCKS`].
///
/// # Safety
/// As [`rows`]; the CPU must have AVX-512 F/BW.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn unpack_group<F: Quants, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    buf: &mut Vec<Line>,
) -> [*const u8; P] {
    let nb = w.nb;
    let per_panel = nb * UNPACKED_BLOCK / 64;
    if buf.len() < P * per_panel {
        buf.resize(P * per_panel, Line([0; 64]));
    }
    let sec = Sections::of(F::FORMAT, nb);
    let dst = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: the panels are checked (`check_args`) and p + P ≤ the panel count (the caller's contract); the
    // buffer holds P·nb blocks of 512 bytes, 64-byte aligned.
    unsafe {
        for i in 0..P {
            let panel = w.bytes.as_ptr().add((p + i) * w.panel_bytes);
            for b in 0..nb {
                let qp = panel.add(sec.qs(b));
                let extra = F::extra(qp);
                let to = dst.add((i * nb + b) * UNPACKED_BLOCK);
                for jj in 0..4 {
                    let [first, second] = F::unpack_pair(qp, jj, extra);
                    _mm512_store_si512(to.add(64 * jj).cast(), first);
                    _mm512_store_si512(to.add(64 * (jj + 4)).cast(), second);
                }
            }
        }
        std::array::from_fn(|i| dst.add(i * per_panel * 64).cast_const())
    }
}

/// A chunk's activations, and for formats with a scale per half block (K6) the Σq of each half block of its rows:
/// the weights' offset comes out of each half's integer sum separately, and [`Act32`] has only whole blocks' sums.
struct Acts<'a> {
    act: &'a Act32<'a>,
    /// Activation row `a`'s sums (2 per block) at `2·nb·(a − first)`; empty for other formats.
    halves: &'a [i32],
    first: usize,
}

impl<'a> Acts<'a> {
    #[inline]
    fn new(act: &'a Act32<'a>, nb: usize, rows: Range<usize>, halves: bool, buf: &'a mut Vec<i32>) -> Acts<'a> {
        buf.clear();
        if halves {
            let qs = &act.qs[rows.start * nb * 32..rows.end * nb * 32];
            buf.extend(qs.chunks_exact(16).map(|h| h.iter().map(|&q| q as i32).sum::<i32>()));
        }
        Acts { act, halves: buf, first: rows.start }
    }
}

/// Most blocks per row whose panel scales [`rows`] widens to f32 once for all its tiles (P·2·16 f32 per block on
/// the stack: 16 KB for two panels of 64 blocks).
const SCALE_CACHE_BLOCKS: usize = 64;

/// Panels `p..p + P` against output rows `outs`, in tiles of as many rows as fit the registers. With more than one
/// tile, the panels' f16 scales (and offsets) are widened to f32 once here rather than once per tile and block.
///
/// # Safety
/// As [`run`], with `p + P` ≤ `w.n_panels` and `outs` within the `n_out` output rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows<F: Quants, const G: usize, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    act: &Acts<'_>,
    outs: Range<usize>,
    next: Ahead,
    unpacked: &mut Vec<Line>,
    out: &OutSink<'_>,
) {
    let nb = w.nb;
    let one_tile = outs.len() <= tile_rows(G, P, F::FORMAT.split_halves());
    // With more than one tile, the panels are unpacked once here where that pays (see `unpack_group`); Q8's
    // tiles read the panels as they are.
    // SAFETY: the caller's contract.
    let pre = (!one_tile && P * nb <= F::PRE_BLOCKS).then(|| unsafe { unpack_group::<F, P>(w, p, unpacked) });
    if one_tile || nb > SCALE_CACHE_BLOCKS {
        // SAFETY: the caller's contract; no scale cache (the pointers are never read).
        unsafe { tiles::<F, G, P, false>(w, p, act, outs, [std::ptr::null(); P], pre, next, out) };
    } else {
        // SAFETY: as above.
        unsafe { rows_cached::<F, G, P>(w, p, act, outs, pre, next, out) };
    }
}

/// [`rows`] with a scale cache. Kept out of line so that its 16 KB stack frame (and the probes a frame that large
/// needs) is only paid where it is used, not on every decode call.
///
/// # Safety
/// As [`rows`], with `w.nb` ≤ [`SCALE_CACHE_BLOCKS`].
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_cached<F: Quants, const G: usize, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    act: &Acts<'_>,
    outs: Range<usize>,
    pre: Option<[*const u8; P]>,
    next: Ahead,
    out: &OutSink<'_>,
) {
    let nb = w.nb;
    assert!(nb <= SCALE_CACHE_BLOCKS);
    let sec = Sections::of(F::FORMAT, nb);
    // Left uninitialised: zeroing 16 KB per call would cost more than it saves; only what is written is read.
    let mut cache = std::mem::MaybeUninit::<[[f32; PANEL_ROWS * 2 * SCALE_CACHE_BLOCKS]; P]>::uninit();
    let base = cache.as_mut_ptr().cast::<f32>();
    let mut scales = [std::ptr::null(); P];
    for (i, sc) in scales.iter_mut().enumerate() {
        // SAFETY: `scales` reads block b's lines of a checked panel (`check_args`); the cache has room for 2·64
        // lines of 16 per panel: line b the scale of weights 0..16, line nb + b the second of `scales`.
        unsafe {
            let panel = w.bytes.as_ptr().add((p + i) * w.panel_bytes);
            let dst = base.add(i * PANEL_ROWS * 2 * SCALE_CACHE_BLOCKS);
            for b in 0..nb {
                let [first, second] = F::scales(panel, &sec, b);
                _mm512_storeu_ps(dst.add(b * PANEL_ROWS), first);
                if two_scales::<F>() {
                    _mm512_storeu_ps(dst.add((nb + b) * PANEL_ROWS), second);
                }
            }
            *sc = dst.cast_const();
        }
    }
    // SAFETY: the caller's contract; `scales` holds every block's widened scales for each panel.
    unsafe { tiles::<F, G, P, true>(w, p, act, outs, scales, pre, next, out) };
}

/// Whether a format's [`Quants::scales`] returns a second line (an offset, or the scale of a second half block).
const fn two_scales<F: Quants>() -> bool {
    F::FORMAT.has_min() || F::FORMAT.split_halves()
}

/// What a panel group's tiles prefetch between them.
#[derive(Clone, Copy)]
enum Ahead {
    /// Batches: the cache lines of the panel group after the current one in a task (none after its last), into
    /// L2.
    Group {
        /// First panel of the next group.
        from: usize,
        /// Its size in 64-byte lines.
        lines: usize,
    },
    /// Decode: the task's panels as one stream, ahead of the reads as `how` says ([`DECODE_AHEAD`] or
    /// [`L2_NEAR_AHEAD`] bytes, into L1 or L2), stopping at `end` (the end of the task's last panel).
    Stream { end: *const u8, how: DecodeStream },
}

/// How far ahead of its reads (in bytes) a decode tile prefetches the panel stream: into L1 where L1D holds more
/// than 32 KB, into L2 where it holds 32 KB or less ([`small_l1d`]). The whole next panel (what decode fetched
/// before) is 26 KB for SmolLM2's Q8_0 FFN-down panels, and with the 26 KB panel in use that overflows Zen 5's
/// 48 KB L1. Per CPU-second GB/s over SmolLM2's 30 layers of panels (one Q8x2 decode row, 2 threads each streaming
/// its own copy, Zen 5, best of 3 interleaved rounds on a loaded host), all into L1: the next panel Q4_1 29.7 /
/// Q8_0 25.3; 8 KB ahead 30.5 / 29.5; 7 KB 27.1 / 32.3; 10 KB 30.1 / 28.0; no prefetch 27.8 / 31.0.
///
/// On Zen 4 (32 KB L1D) the same 8 KB into L1 left Q8_0 decode slower per CPU-second than the 256-bit kernel,
/// which streams Q8 panels into L2. SmolLM2's 30 layers, Q8x2 decode, tokens per CPU-second on one thread / per
/// wall second on two, medians of 5-7 interleaved rounds per run (`matmul` bench, scratch build with the choice as
/// a runtime knob), 8 KB into L1 → into L2: Q8_0 128 → 158 / 186 → 216 and 131 → 144 / 171 → 202; Q4_1 222 → 267 /
/// 361 → 389 and 227 → 261 / 384 → 402 (the 256-bit kernel, same rounds: Q8_0 157 / 209, Q4_1 257 / 402). Other
/// distances into L2, one run: Q8_0 3 KB 144 / 219, 4 KB 161 / 239, 6 KB 176 / 235, 8 KB 189 / 248, 12 KB 148 /
/// 227; into L1: 2 KB 111 / 179, 4 KB 125 / 215; none 97 / 111. End to end, tg128 on 2 threads, 4 interleaved
/// rounds, L1 → L2 medians: Q8_0 163 → 181, Q4_1 222 → 254, Q4_0 269 → 272, Gemma 3 98 → 105 t/s (L2 ahead in
/// 14 of those 16 pairs).
///
/// Intel cores streaming from DRAM go [`L2_NEAR_AHEAD`] ahead into L2 instead ([`DecodeStream::L2Near`]).
const DECODE_AHEAD: usize = 8 * 1024;

/// How far ahead of its reads a decode tile's stream runs.
#[inline(always)]
fn stream_ahead(how: DecodeStream) -> usize {
    if how == DecodeStream::L2Near { L2_NEAR_AHEAD } else { DECODE_AHEAD }
}

/// Prefetches `lines` from `at` into the cache level of the stream `how`.
#[inline(always)]
fn stream_hint(how: DecodeStream, at: *const u8, lines: Range<usize>) {
    if how == DecodeStream::L1Far { prefetch_lines(at, lines) } else { prefetch_l2(at, lines) }
}

/// Cache lines of the `bytes` from `at` that lie before `end` (none when `at` is at or past it).
#[inline(always)]
fn stream_lines(at: *const u8, bytes: usize, end: *const u8) -> usize {
    bytes.min(end.addr().saturating_sub(at.addr())) / 64
}

/// Output rows in the next tile when `left` remain: as many as fit the registers, falling back to 4, 3, 2, 1.
const fn tile_size(left: usize, group: usize, panels: usize, halves: bool) -> usize {
    let most = tile_rows(group, panels, halves);
    if left >= 8 && most >= 8 {
        8
    } else if left >= 4 && most >= 4 {
        4
    } else if left >= 3 && most >= 3 {
        3
    } else if left >= 2 {
        2
    } else {
        1
    }
}

/// The tile loop of [`rows`].
///
/// Batched, the first tile of a panel group reads it from memory and the others from L1. Each tile prefetches a
/// share of the next group's lines in proportion to its rows, so the reads of the next group are spread over the
/// whole of this one rather than crowded into its first tile, where they queue behind each other.
///
/// # Safety
/// As [`rows`]; with `CACHED`, `scales` as [`rows`] fills it; `next` within `w`'s panels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)] // the hot tile takes its pointers apart rather than through a struct
unsafe fn tiles<F: Quants, const G: usize, const P: usize, const CACHED: bool>(
    w: &PackedView<'_>,
    p: usize,
    act: &Acts<'_>,
    outs: Range<usize>,
    scales: [*const f32; P],
    pre: Option<[*const u8; P]>,
    next: Ahead,
    out: &OutSink<'_>,
) {
    // Each tile's share of the lines is in proportion to its rows, so that a short last tile does not fetch the
    // last panel's scales just before they are read. Decode (one output row) is one tile that streams.
    let share = |rows: Range<usize>| match next {
        Ahead::Group { from, lines } => {
            let ahead = w.bytes.as_ptr().wrapping_add(from * w.panel_bytes);
            let at = |o: usize| (o - outs.start) * lines / outs.len();
            let (lo, hi) = (at(rows.start), at(rows.end));
            Prefetch::Lines { first: ahead.wrapping_add(64 * lo), count: hi - lo }
        }
        Ahead::Stream { end, how } => Prefetch::Stream { end, how },
    };
    let mut o = outs.start;
    // SAFETY (all): o + C ≤ outs.end in every call; the rest is the caller's.
    while o < outs.end {
        let c = tile_size(outs.end - o, G, P, F::FORMAT.split_halves());
        let pf = share(o..o + c);
        if let Some(pre) = pre {
            match c {
                8 => unsafe { tile::<F, G, 8, P, CACHED, true>(w, p, act, o, pf, scales, pre, out) },
                4 => unsafe { tile::<F, G, 4, P, CACHED, true>(w, p, act, o, pf, scales, pre, out) },
                3 => unsafe { tile::<F, G, 3, P, CACHED, true>(w, p, act, o, pf, scales, pre, out) },
                2 => unsafe { tile::<F, G, 2, P, CACHED, true>(w, p, act, o, pf, scales, pre, out) },
                _ => unsafe { tile::<F, G, 1, P, CACHED, true>(w, p, act, o, pf, scales, pre, out) },
            }
        } else {
            let none = [std::ptr::null(); P];
            match c {
                8 => unsafe { tile::<F, G, 8, P, CACHED, false>(w, p, act, o, pf, scales, none, out) },
                4 => unsafe { tile::<F, G, 4, P, CACHED, false>(w, p, act, o, pf, scales, none, out) },
                3 => unsafe { tile::<F, G, 3, P, CACHED, false>(w, p, act, o, pf, scales, none, out) },
                2 => unsafe { tile::<F, G, 2, P, CACHED, false>(w, p, act, o, pf, scales, none, out) },
                _ => unsafe { tile::<F, G, 1, P, CACHED, false>(w, p, act, o, pf, scales, none, out) },
            }
        }
        o += c;
    }
}

/// What one tile prefetches. Prefetches are hints that cannot fault, so the addresses are computed with
/// `wrapping_add` and never dereferenced.
#[derive(Clone, Copy)]
enum Prefetch {
    /// `count` cache lines from `first` into L2, spread over the tile's blocks. The batch tiles fetch a whole group
    /// of two panels ahead; into L1 that evicted the lines in use before they were read (Zen 4's L1D holds 32 KB,
    /// one Q8 group of SmolLM2's FFN-down matrix 52 KB). Single-thread decode per CPU-second on SmolLM2's layer
    /// matmuls, L1 → L2, best of 4 interleaved rounds on a loaded host, when decode also ran two panels per tile:
    /// Q4_1 181.6 → 220.4, Q8_0 106.8 → 147.6 tokens; with 2 and 4 activation rows Q8_0 211 → 327 and 317 → 410;
    /// with 16 unchanged. (Decode, one panel per tile, streams instead: [`DECODE_AHEAD`].)
    Lines { first: *const u8, count: usize },
    /// Each block's own lines further on, as far and into the cache level `how` says, none at or past `end`.
    Stream { end: *const u8, how: DecodeStream },
}

/// Repeats `body` with `c` bound to each constant `0..C` (`C` ≤ 8) so that `[_; C]` accumulators indexed by `c`
/// become registers: LLVM does not unroll the output-row loop on its own, and then keeps them in memory.
macro_rules! for_each_c {
    ($C:ident, $c:ident, $body:block) => {
        for_each_c!(@ $C, $c, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $C:ident, $c:ident, $body:block, $($i:literal)*) => {
        $( if $i < $C { let $c: usize = $i; $body } )*
    };
}

/// Panels `p..p + P` against output rows `o..o + C`. Two panels share every broadcast activation group, halving
/// the loads per `vpdpbusd` (with one panel the broadcasts, one load per `vpdpbusd`, compete with it).
///
/// With `CACHED`, `scales` holds each panel's scales (then offsets) widened to f32, 16 per block.
///
/// # Safety
/// As [`run`], with `p + P` ≤ `w.n_panels` and `(o + C)·G` activation rows present; `scales` as [`rows`] fills it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)] // the hot tile takes its pointers apart rather than through a struct
unsafe fn tile<F: Quants, const G: usize, const C: usize, const P: usize, const CACHED: bool, const PRE: bool>(
    w: &PackedView<'_>,
    p: usize,
    act: &Acts<'_>,
    o: usize,
    pf: Prefetch,
    scales: [*const f32; P],
    pre: [*const u8; P],
    out: &OutSink<'_>,
) {
    const { assert!(C >= 1 && C <= 8 && (G == 1 || G == 2) && (P == 1 || P == 2)) };
    let nb = w.nb;
    let row_q = nb * 32; // bytes of one activation row's quants
    // SAFETY: all pointer arithmetic stays inside panels `p..p + P` (the offsets of `Sections` for nb blocks:
    // `panel_bytes` covers them, checked by `check_args`) and inside the activation
    // rows `o·G..(o + C)·G` of `nb` blocks each, which the caller guarantees exist. In the block loop offsets
    // are shifts and pointer steps, not checked multiplications (overflow checks are on in release builds).
    unsafe {
        let base: [*const u8; P] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        // From the format constant, so that every offset below is a few operations on constants.
        let sec = Sections::of(F::FORMAT, nb);
        let halves = F::FORMAT.split_halves();
        // Output row c's first activation row: quants, Σq (of half blocks with `halves`) and s; its last row's
        // scale d (the residual's for Q8x2).
        let first = |c: usize| (o + c) * G;
        let (a, hs) = (act.act, act.halves.as_ptr());
        let aq: [*const u8; C] = std::array::from_fn(|c| a.qs.as_ptr().add(first(c) * row_q).cast::<u8>());
        let ai: [*const i32; C] = std::array::from_fn(|c| a.isum.as_ptr().add(first(c) * nb));
        let ah: [*const i32; C] = std::array::from_fn(|c| hs.wrapping_add(2 * nb * (first(c).wrapping_sub(act.first))));
        let asum: [*const f32; C] = std::array::from_fn(|c| a.s.as_ptr().add(first(c) * nb));
        let ad: [*const f32; C] = std::array::from_fn(|c| a.d.as_ptr().add((first(c) + G - 1) * nb));
        let off = F::FORMAT.offset();
        let mut acc = [[_mm512_setzero_ps(); C]; P];
        for b in 0..nb {
            let qp: [*const u8; P] = std::array::from_fn(|i| base[i].add(sec.qs(b)));
            // Decode streams the weights from DRAM once, and batches read each group from memory in their first
            // tile: the hardware prefetcher alone leaves the cores waiting, even now that a panel is one stream
            // (SmolLM2 and Gemma 3 tg128 on 2 threads, Zen 5, interleaved rounds on a loaded host: no software
            // prefetch was the slowest of all choices, e.g. Q5_0 median 208 t/s against 277). For decode, the
            // next panel into L1 measured best of the whole-panel choices: median t/s of 8 rounds, Q4_1 306 /
            // Q8_0 207 / Gemma 3 122, against 294 / 184 / 107 for the panel after next into L2 (what the split
            // layout wanted), 302 / 195 / 117 for the next into L2, 297 / 195 / 117 for the one after next into
            // L1; a fixed distance ahead in the stream ([`DECODE_AHEAD`]) then beat it.
            match pf {
                Prefetch::Lines { first, count } => {
                    let per_block = count.div_ceil(nb);
                    prefetch_l2(first, b * per_block..((b + 1) * per_block).min(count))
                }
                Prefetch::Stream { end, how } => {
                    // Block b's lines: its quants, and after a group's last block the group's scales (the last
                    // block of a panel also its padding, so that consecutive panels are one stream).
                    let (start, stop) = (sec.qs(b), if b + 1 < nb { sec.qs(b + 1) } else { w.panel_bytes });
                    for panel in base {
                        let at = panel.wrapping_add(start + stream_ahead(how));
                        stream_hint(how, at, 0..stream_lines(at, stop - start, end));
                    }
                }
            }
            let extra: [__m512i; P] =
                std::array::from_fn(|i| if PRE { _mm512_setzero_si512() } else { F::extra(qp[i]) });
            // With PRE, block b's unpacked weight groups (see `unpack_group`).
            let up: [*const u8; P] = std::array::from_fn(|i| pre[i].wrapping_add(b * UNPACKED_BLOCK));
            // The integer dot products of all P·C·G (panel, activation row) pairs advance together, weight group
            // by weight group: consecutive `vpdpbusd` are independent, so their latency hides behind each other.
            // With few rows (decode) each chain is also split in two, so at least four are in flight; integer
            // sums are exact, so neither the split nor the group order changes the result.
            // A format with a scale per half block keeps the halves' sums apart (weight groups jj and jj + 4 are
            // the two halves).
            let split = if halves || P * C * G <= 2 { 2 } else { 1 };
            let mut iv = [[[[_mm512_setzero_si512(); C]; G]; P]; 2];
            if off != 0 {
                for_each_c!(C, c, {
                    for g in 0..G {
                        for h in 0..1 + usize::from(halves) {
                            let sum = if halves { *ah[c].add(g * 2 * nb + 2 * b + h) } else { *ai[c].add(g * nb + b) };
                            let init = _mm512_set1_epi32((-off).wrapping_mul(sum));
                            for i in 0..P {
                                iv[h][i][g][c] = init;
                            }
                        }
                    }
                });
            }
            for jj in 0..4 {
                let u: [[__m512i; 2]; P] = std::array::from_fn(|i| {
                    if PRE {
                        [
                            _mm512_load_si512(up[i].add(64 * jj).cast()),
                            _mm512_load_si512(up[i].add(64 * (jj + 4)).cast()),
                        ]
                    } else {
                        F::unpack_pair(qp[i], jj, extra[i])
                    }
                });
                for_each_c!(C, c, {
                    for g in 0..G {
                        let q = aq[c].add(g * row_q).add(b << 5);
                        for half in 0..2 {
                            let j = jj + 4 * half;
                            let bc = _mm512_set1_epi32(q.add(4 * j).cast::<i32>().read_unaligned());
                            for i in 0..P {
                                let v = &mut iv[half % split][i][g][c];
                                *v = _mm512_dpbusd_epi32(*v, u[i][half], bc);
                            }
                        }
                    }
                });
            }
            for i in 0..P {
                // The scale of weights 0..16, then the offset or the second half's scale (see `Quants::scales`).
                let sv = if CACHED {
                    let sc = scales[i];
                    let second =
                        if two_scales::<F>() { _mm512_loadu_ps(sc.add((nb + b) << 4)) } else { _mm512_setzero_ps() };
                    [_mm512_loadu_ps(sc.add(b << 4)), second]
                } else {
                    F::scales(base[i], &sec, b)
                };
                for_each_c!(C, c, {
                    let da = _mm512_set1_ps(*ad[c].add(b));
                    // The integer sum of a whole block (or of each half block), the Q8x2 pair as 256·i₁ + i₂.
                    let combine = |h: usize| {
                        let mut part = [_mm512_setzero_si512(); G];
                        for g in 0..G {
                            part[g] = if halves {
                                iv[h][i][g][c]
                            } else if split == 2 {
                                _mm512_add_epi32(iv[0][i][g][c], iv[1][i][g][c])
                            } else {
                                iv[0][i][g][c]
                            };
                        }
                        if G == 2 { _mm512_add_epi32(_mm512_slli_epi32(part[0], 8), part[G - 1]) } else { part[0] }
                    };
                    for h in 0..1 + usize::from(halves) {
                        let scale = _mm512_mul_ps(sv[h], da);
                        acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(combine(h)), scale, acc[i][c]);
                    }
                    if F::FORMAT.has_min() {
                        acc[i][c] = _mm512_fmadd_ps(sv[1], _mm512_set1_ps(*asum[c].add(b)), acc[i][c]);
                    }
                });
            }
        }
        for (i, panel_acc) in acc.iter().enumerate() {
            for (c, v) in panel_acc.iter().enumerate() {
                let mut lanes = [0f32; PANEL_ROWS];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                out.put_row(o + c, (p + i) * PANEL_ROWS, &lanes);
            }
        }
    }
}

// -------------------------------------------------------------------------------------------------------------
// Float panels (F32, F16) against f32 activations. A block's column k holds the panel's 16 weights of input k, one
// 512-bit register: a tile loads each panel's column once, broadcasts each activation once, and runs one fused
// multiply-add per (panel, activation row), with one accumulator chain per output element as `panel_ref_f` states.

/// Sixteen weights (one column) of a float panel, as f32.
trait FloatZ {
    /// Bytes per weight.
    const SIZE: usize;
    /// Whether a decode tile prefetches each panel's column stream [`DECODE_AHEAD_F`] bytes ahead into L1.
    const PREFETCH: bool;
    /// # Safety
    /// `16 · SIZE` bytes must be readable at `p`, `16 · SIZE`-aligned; the CPU must have AVX-512 F.
    unsafe fn load16(p: *const u8) -> __m512;
}

impl FloatZ for f32 {
    const SIZE: usize = 4;
    const PREFETCH: bool = false;
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_load_ps(p.cast()) }
    }
}

impl FloatZ for half::f16 {
    const SIZE: usize = 2;
    const PREFETCH: bool = true;
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_load_si256(p.cast())) }
    }
}

/// Activation rows and panels of a float tile: 8 × 3 accumulators, three weight columns and a broadcast fill 28 of
/// the 32 registers, and each column load serves 8 fused multiply-adds, each broadcast 3 (the 256-bit tile's 6 × 2
/// halves of one panel load twice as much per multiply-add).
const ROWS_F: usize = 8;
const PANELS_F: usize = 3;
/// Activation rows whose values stay in L1/L2 while all of a task's panels pass.
const CHUNK_F: usize = 48;

/// F32/F16 panels: prefill tiles of [`ROWS_F`] × [`PANELS_F`]; decode (one activation row) streams
/// [`DECODE_F`] panels at a time ([`decode_f`]).
///
/// # Safety
/// The CPU must have AVX-512 F plus AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel_f(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    check_args_f(&w, &panels, x, n_act);
    // SAFETY (all): the arguments were checked above and the caller has the features.
    unsafe {
        match (w.format, n_act) {
            (PackedFormat::F32, 1) => decode_f::<f32>(&w, panels, x, out),
            (_, 1) => decode_f::<half::f16>(&w, panels, x, out),
            (PackedFormat::F32, _) => run_f::<f32>(&w, panels, x, n_act, out),
            _ => run_f::<half::f16>(&w, panels, x, n_act, out),
        }
    }
}

/// Decode: [`DECODE_F`] panels at a time, one 512-bit column load and one fused multiply-add per panel and input,
/// the same accumulation per output element as the 256-bit tile's two halves (so the same results), in half the
/// instructions. Single thread, SmolLM2 F16 tg64, tokens per CPU-second, best of 5 interleaved rounds on a loaded
/// host, both with the L2 prefetch: the 256-bit tile 89, this one 102 (with 8 panels per tile 95).
///
/// # Safety
/// As [`panel_f`], with its arguments checked by [`check_args_f`] and `n_act` = 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_f<T: FloatZ>(w: &PackedView<'_>, panels: Range<usize>, x: &[f32], out: &OutSink<'_>) {
    let mut p = panels.start;
    let l2 = small_l1d();
    // SAFETY (all tiles): panels p..p + P lie in the checked range.
    unsafe {
        while p < panels.end {
            match panels.end - p {
                1 => decode_tile_f::<T, 1>(w, p, x, l2, out),
                2 => decode_tile_f::<T, 2>(w, p, x, l2, out),
                3 => decode_tile_f::<T, 3>(w, p, x, l2, out),
                _ => decode_tile_f::<T, DECODE_F>(w, p, x, l2, out),
            }
            p += (panels.end - p).min(DECODE_F);
        }
    }
}

/// How far ahead of its reads (in bytes) each F16 panel's column stream is prefetched into L1 by a decode tile
/// (four streams, so 8 KB in all, as the quantized [`DECODE_AHEAD`]). Per CPU-second GB/s over SmolLM2's 30
/// layers of F16 panels (2 threads each streaming its own copy, Zen 5, 3 interleaved rounds on a loaded host):
/// the next tile's panels into L2 (as before) 21.9 / 24.9 / 23.0, into L1 21.8 / 22.9 / 23.0; 2 KB ahead 24.4 /
/// 26.2 / 25.7; 1 KB 21.2 / 22.7 / 22.8; 4 KB 23.6 / 24.3 / 23.0; none 19.2 / 19.7 / 18.4. F32 reads at the probe's
/// rate without any (on Zen 4 too: 4 KB into L2 cost it 54 → 45 tokens per CPU-second on one thread).
const DECODE_AHEAD_F: usize = 2 * 1024;

/// Panels `p..p + P` against the one activation row `x`, prefetching their streams on the way (`T::PREFETCH`;
/// with `l2`, [`super::packed256::DECODE_AHEAD_F_L2`] ahead into L2).
///
/// # Safety
/// As [`decode_f`], with `p + P` ≤ `w.n_panels`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_tile_f<T: FloatZ, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    l2: bool,
    out: &OutSink<'_>,
) {
    const { assert!(P >= 1 && P <= DECODE_F) };
    let cols = w.nb * 32;
    let column = PANEL_ROWS * T::SIZE;
    // Columns per cache line: each stream fetches one line per line it reads.
    let per_line = 64 / column;
    // SAFETY: the pointers stay inside panels p..p + P (nb blocks of 32 columns, `panel_bytes` each, checked) and
    // inside x's `cols` values; every column starts on a multiple of its size.
    unsafe {
        let base: [*const u8; P] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        let mut acc = [_mm512_setzero_ps(); P];
        for k in 0..cols {
            if T::PREFETCH && k % per_line == 0 {
                prefetch_streams(base, k * column, l2, DECODE_AHEAD_F);
            }
            let xb = _mm512_set1_ps(*x.as_ptr().add(k));
            for i in 0..P {
                acc[i] = _mm512_fmadd_ps(T::load16(base[i].add(k * column)), xb, acc[i]);
            }
        }
        for (i, v) in acc.iter().enumerate() {
            let mut lanes = [0f32; PANEL_ROWS];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
            out.put_row(0, (p + i) * PANEL_ROWS, &lanes);
        }
    }
}

/// # Safety
/// As [`panel_f`], with its arguments checked by [`check_args_f`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_f<T: FloatZ>(w: &PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    let mut o0 = 0;
    while o0 < n_act {
        let o1 = (o0 + CHUNK_F).min(n_act);
        let tiles = (o1 - o0).div_ceil(ROWS_F);
        let mut p = panels.start;
        while p < panels.end {
            let np = (panels.end - p).min(PANELS_F);
            // The panels the task reads next (this chunk's, or after the last the next chunk's first): the tiles
            // over these fetch them into L2 between them, as the 256-bit kernel's `full_tile_f` explains.
            let next = if p + np < panels.end {
                p + np..(p + np + PANELS_F).min(panels.end)
            } else if o1 < n_act {
                panels.start..(panels.start + PANELS_F).min(panels.end)
            } else {
                0..0
            };
            let lines = next.len() * w.panel_bytes / 64;
            let mut o = o0;
            let mut t = 0;
            while o < o1 {
                let c = (o1 - o).min(ROWS_F);
                let (a, b) = (t * lines / tiles, (t + 1) * lines / tiles);
                // A hint, never dereferenced: `wrapping_add` keeps the arithmetic defined whatever `next` is.
                let pf = (w.bytes.as_ptr().wrapping_add(next.start * w.panel_bytes + 64 * a), b - a);
                // SAFETY: panels p..p + np and rows o..o + c lie in the checked ranges.
                unsafe {
                    match np {
                        1 => tile_f_rows::<T, 1>(w, p, x, o, c, out, pf),
                        2 => tile_f_rows::<T, 2>(w, p, x, o, c, out, pf),
                        _ => tile_f_rows::<T, PANELS_F>(w, p, x, o, c, out, pf),
                    }
                }
                o += c;
                t += 1;
            }
            p += np;
        }
        o0 = o1;
    }
}

/// [`tile_f`] for `c` (1..=[`ROWS_F`]) rows.
///
/// # Safety
/// As [`tile_f`].
#[inline(always)]
unsafe fn tile_f_rows<T: FloatZ, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    o: usize,
    c: usize,
    out: &OutSink<'_>,
    pf: (*const u8, usize),
) {
    // SAFETY: the caller's contract.
    unsafe {
        match c {
            1 => tile_f::<T, 1, P>(w, p, x, o, out, pf),
            2 => tile_f::<T, 2, P>(w, p, x, o, out, pf),
            3 => tile_f::<T, 3, P>(w, p, x, o, out, pf),
            4 => tile_f::<T, 4, P>(w, p, x, o, out, pf),
            5 => tile_f::<T, 5, P>(w, p, x, o, out, pf),
            6 => tile_f::<T, 6, P>(w, p, x, o, out, pf),
            7 => tile_f::<T, 7, P>(w, p, x, o, out, pf),
            _ => tile_f::<T, ROWS_F, P>(w, p, x, o, out, pf),
        }
    }
}

/// Panels `p..p + P` against activation rows `o..o + C`, fetching the `pf.1` lines at `pf.0` into L2 on the way,
/// evenly spread over the columns.
///
/// # Safety
/// As [`run_f`], with `p + P` ≤ `w.n_panels` and rows `o..o + C` in `x`; `pf` is only a hint.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_f<T: FloatZ, const C: usize, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    o: usize,
    out: &OutSink<'_>,
    pf: (*const u8, usize),
) {
    const { assert!(C >= 1 && C <= ROWS_F && P >= 1 && P <= PANELS_F) };
    let cols = w.nb * 32;
    let column = PANEL_ROWS * T::SIZE;
    // A line every `every` columns (at most one a column: a share larger than the columns is cut short).
    let every = (cols / pf.1.max(1)).max(1);
    let (mut pf_at, mut pf_k) = (pf.0, if pf.1 > 0 { 0 } else { usize::MAX });
    let pf_end = pf.0.wrapping_add(64 * pf.1.min(cols));
    // SAFETY: the pointers stay inside panels p..p + P (nb blocks of 32 columns, `panel_bytes` each, checked) and
    // inside rows o..o + C of `x`, which the caller guarantees; every column starts on a multiple of its size.
    unsafe {
        let base: [*const u8; P] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        let xr: [*const f32; C] = std::array::from_fn(|c| x.as_ptr().add((o + c) * cols));
        let mut acc = [[_mm512_setzero_ps(); P]; C];
        for k in 0..cols {
            if k == pf_k {
                prefetch_l2(pf_at, 0..1);
                pf_at = pf_at.wrapping_add(64);
                pf_k = if pf_at == pf_end { usize::MAX } else { k + every };
            }
            let wv: [__m512; P] = std::array::from_fn(|i| T::load16(base[i].add(k * column)));
            for_each_c!(C, c, {
                let xb = _mm512_set1_ps(*xr[c].add(k));
                for i in 0..P {
                    acc[c][i] = _mm512_fmadd_ps(wv[i], xb, acc[c][i]);
                }
            });
        }
        for (c, row) in acc.iter().enumerate() {
            for (i, v) in row.iter().enumerate() {
                let mut lanes = [0f32; PANEL_ROWS];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                out.put_row(o + c, (p + i) * PANEL_ROWS, &lanes);
            }
        }
    }
}
