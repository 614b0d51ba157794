//! The AVX2 kernel for 16-row panels ([`crate::packed`]): the same panels the AVX-512 kernel reads. A panel's
//! 64-byte chunk is two 256-bit registers here, rows 0..8 and rows 8..16 (the panel's two halves), each holding
//! four unsigned weight bytes per row.
//!
//! AVX2 has no 8-bit dot product that accumulates into 32 bits (`vpmaddubsw` saturates its 16-bit pair sums,
//! which Q8 weights and the residual of Q8x2 both overflow), so the weights are widened to 16 bits and multiplied
//! with `vpmaddwd` against 16-bit activations. That fuses the two parts of a Q8x2 activation: the pair
//! `(q1, q2)` with `d2 = d1/256` is the single 16-bit value `256·q1 + q2` (at most 256·127 + 127 = 32639), so
//! one multiply serves both, and the integer sum is exactly the `256·i₁ + i₂` that [`crate::packed::panel_ref`]
//! forms. With 8-bit activations (`group == 1`) the value is `q1` itself. Decode, which meets each weight once, is
//! the exception for the formats whose weights stay below 32 (Q4_0, Q4_1, Q5_0, Q4_K): there `vpmaddubsw` takes the
//! weight bytes as they are against each 8-bit part of the activations ([`byte_products`]), with no widening, and
//! a few of its pair sums add up in 16 bits before they can saturate; so do Q4_0, Q4_1 and Q4_K batches of 8-bit
//! activations, and small batches of `q8x2` ones ([`row_tiles`]). Each thread widens the activation rows it is
//! about to use once per call into a buffer of its own ([`Act16`]), a cost of one pass over the activations
//! against one pass over the weights per row of them.
//!
//! A tile is `S` halves (of one or two panels) × `C` output rows. Per block and pair of weight groups it unpacks
//! each half's quants once and widens each row's four bytes `w0 w1 w2 w3` to two registers of 16-bit pairs,
//! `(w0, w2)` (a mask) and `(w1, w3)` (a shift), one 32-bit lane per row either way; the activation buffer holds
//! each group of four as `a0 a2 a1 a3`, so one broadcast 32-bit pair meets each register and two `vpmaddwd` add a
//! row's four products into its lane. The float epilogue follows `panel_ref`'s order of operations exactly, so the
//! results equal it bit for bit.

use std::arch::x86_64::*;
use std::cell::Cell;
use std::ops::Range;

use super::cache::small_l1d;
use crate::dispatch::{Act32, OutSink};
use crate::packed::{PANEL_ROWS, PackedFormat, PackedView, Sections, check_args, check_args_f};

/// Rows per half panel: one i32 lane each in a 256-bit register.
const HALF: usize = PANEL_ROWS / 2;

/// Output rows converted to 16 bits at a time: their activations stay in L2 while the task's panels pass. A
/// multiple of [`TILE_W`], so that a prefill chunk has no remainder tile.
pub(crate) const ACT_CHUNK: usize = 48;

/// Output rows of a batch tile ([`tile_w`]): 3 rows × 2 halves = 6 integer accumulators, with the 4 weight
/// registers of a pair of groups, 2 activation broadcasts and 2 products, in 14 of the 16 registers
/// ([`wide_step3`]; the float accumulators live in L1). Also for Q6_K, whose half blocks are scaled apart: its
/// two parts are summed one after the other into 6 accumulators each.
const TILE_W: usize = 3;

/// Blocks of a panel widened at a time ([`widen`]): 1 KB each, so 16 KB stay in L1 while every tile of the chunk
/// reads them.
const WIDE_BLOCKS: usize = 16;

/// Registers of widened weights per block: 2 halves × 4 pairs of groups × 2 parts × (even, odd).
const WIDE_PER_BLOCK: usize = 32;

/// One output row's activations widened to 16 bits, for a chunk of output rows: row `i`'s values are
/// `q[i·cols..][..cols]`, each group of four in the order 0, 2, 1, 3 (see the module documentation); per block its scale `d` (the last part's, as `panel_ref` scales), its `s` (the first
/// part's, which carries both parts' offset terms) and `isum`, the Σq of the combined value; for formats with a
/// scale per half block, `hsum` holds the two halves' Σq (2 per block).
#[derive(Default)]
struct Act16 {
    q: Vec<i16>,
    d: Vec<f32>,
    s: Vec<f32>,
    isum: Vec<i32>,
    hsum: Vec<i32>,
}

thread_local! {
    /// Each thread's [`Act16`], grown to the largest chunk seen and reused, so that calls do not allocate.
    static ACT16: Cell<Act16> = Cell::new(Act16::default());
}

thread_local! {
    /// Each thread's widened weights ([`widen`]) and the float accumulators of a chunk's rows ([`wide_tiles`]).
    static WIDE: Cell<(Vec<__m256i>, Vec<[__m256; 2]>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

impl Act16 {
    /// Fills the buffer with output rows `outs` of `act` (`G` activation rows each, `nb` blocks per row), and
    /// with `halves` the half blocks' sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fill<const G: usize>(&mut self, act: &Act32<'_>, nb: usize, outs: Range<usize>, halves: bool) {
        let cols = nb * 32;
        let n = outs.len();
        self.q.resize(self.q.len().max(n * cols), 0);
        for v in [&mut self.d, &mut self.s] {
            v.resize(v.len().max(n * nb), 0.0);
        }
        self.isum.resize(self.isum.len().max(n * nb), 0);
        if halves {
            self.hsum.resize(self.hsum.len().max(2 * n * nb), 0);
        }
        for (i, o) in outs.enumerate() {
            let a = o * G;
            let q1 = &act.qs[a * cols..(a + 1) * cols];
            let q2 = &act.qs[(a + G - 1) * cols..(a + G) * cols];
            let dst = &mut self.q[i * cols..(i + 1) * cols];
            for k in (0..cols).step_by(16) {
                let (x1, x2) = (&q1[k..k + 16], &q2[k..k + 16]);
                // SAFETY: the slices above hold 16 bytes each; no alignment requirement.
                let (v1, v2) = unsafe {
                    (
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(x1.as_ptr().cast())),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(x2.as_ptr().cast())),
                    )
                };
                let v = if G == 2 { _mm256_add_epi16(_mm256_slli_epi16(v1, 8), v2) } else { v1 };
                // a0 a1 a2 a3 → a0 a2 a1 a3 in every group of four (bytes within 128-bit lanes).
                let order = _mm256_setr_epi8(
                    0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15, 0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11,
                    14, 15,
                );
                let v = _mm256_shuffle_epi8(v, order);
                let out = &mut dst[k..k + 16];
                // SAFETY: 16 i16 = 32 writable bytes; no alignment requirement.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
            }
            let blocks = |r: usize| r * nb..(r + 1) * nb;
            self.d[blocks(i)].copy_from_slice(&act.d[blocks(a + G - 1)]);
            self.s[blocks(i)].copy_from_slice(&act.s[blocks(a)]);
            for (b, sum) in self.isum[blocks(i)].iter_mut().enumerate() {
                let (i1, i2) = (act.isum[a * nb + b], act.isum[(a + G - 1) * nb + b]);
                *sum = if G == 2 { (i1 << 8) + i2 } else { i1 };
            }
            if halves {
                // The combined values' sums, per 16 (their order within a group of four does not matter).
                let sums = dst.chunks_exact(16).map(|h| h.iter().map(|&v| v as i32).sum::<i32>());
                for (hs, v) in self.hsum[2 * i * nb..2 * (i + 1) * nb].iter_mut().zip(sums) {
                    *hs = v;
                }
            }
        }
    }
}

/// Prefetches cache lines `lines` (64 bytes each) from `at` into L1: hints, which cannot fault, so the address is
/// computed with `wrapping_add` and may lie past the matrix. Both panel kernels' decode streams use it.
#[inline(always)]
pub(crate) fn prefetch_lines(at: *const u8, lines: Range<usize>) {
    prefetch_hint::<_MM_HINT_T0>(at, lines);
}

/// [`prefetch_lines`] into L2 (`prefetcht1`): the batch tiles of both panel kernels fetch the panels after the
/// current ones there.
#[inline(always)]
pub(crate) fn prefetch_l2(at: *const u8, lines: Range<usize>) {
    prefetch_hint::<_MM_HINT_T1>(at, lines);
}

/// The float decode tiles of both panel kernels: one line of each panel's column stream past byte `at` of the
/// panel, `ahead` bytes on into L1, or with `l2` [`DECODE_AHEAD_F_L2`] bytes on into L2 (where L1D is small).
/// Called once per line a stream reads, so each stream stays that far in front of its loads. Past a panel's end the
/// stream runs into the next panel (for a task's last tile, perhaps the next task's): a harmless hint.
#[inline(always)]
pub(crate) fn prefetch_streams<const P: usize>(panels: [*const u8; P], at: usize, l2: bool, ahead: usize) {
    for panel in panels {
        if l2 {
            prefetch_l2(panel.wrapping_add(at + DECODE_AHEAD_F_L2), 0..1);
        } else {
            prefetch_lines(panel.wrapping_add(at + ahead), 0..1);
        }
    }
}

/// [`prefetch_lines`] with the cache level as a parameter (`_MM_HINT_T0` L1, `_MM_HINT_T1` L2).
#[inline(always)]
fn prefetch_hint<const HINT: i32>(at: *const u8, lines: Range<usize>) {
    for line in lines {
        // SAFETY: a prefetch is a hint that never faults; SSE is part of x86-64.
        unsafe { _mm_prefetch::<HINT>(at.wrapping_add(64 * line).cast()) };
    }
}

/// The format-specific part of a tile: how a half's quants become registers of unsigned bytes, a pair of weight
/// groups at a time (groups `jj` and `jj + 4`: weights `4jj..4jj + 4` and `16 + 4jj..16 + 4jj + 4`, which share a
/// nibble chunk in the 4-bit formats).
trait Quants {
    const FORMAT: PackedFormat;
    /// The largest unsigned weight byte of the format (before its offset), where it is small enough for the decode
    /// tile to multiply the bytes with the activations' 8-bit parts directly ([`byte_products`]); 0 where it is
    /// not (Q8 and K6 take the widened path).
    const TOP_QUANT: i32 = 0;
    /// The most `q8x2` rows that take [`row_tiles`] (tiles of two rows, each panel in L1 while every row passes)
    /// rather than [`wide_tiles`] (each block widened once per chunk of rows into an L1 scratch that all of them
    /// read). Widening a block costs about 120 operations for the panel (16 rows × 32 weights), which a batch of a
    /// few rows cannot spread, while the tiles of two rows keep more in registers, and some formats spill there.
    /// Measured per format on Zen 1 (`infer bench --batch`, 2 threads, tokens per CPU-second, medians of 4
    /// alternated rounds; the impls give the figures); 0 where small batches lost.
    const SMALL_BATCH: usize = 0;
    /// Whatever the pairs need from the block besides their chunk (Q5's high bits), loaded once per block.
    ///
    /// # Safety
    /// `qs` must point to one block's quants plus 32 bytes per half before it (the half's first chunk), 32-byte
    /// aligned, with the block's `FORMAT.qs_bytes()` readable from the block's start; the CPU must have AVX2.
    #[inline(always)]
    unsafe fn extra(_qs: *const u8) -> __m256i {
        // SAFETY: the caller has the features.
        unsafe { _mm256_setzero_si256() }
    }
    /// Weight groups `jj` and `jj + 4` (`jj` < 4) of the half: for each of its 8 rows, four unsigned bytes.
    ///
    /// # Safety
    /// As [`Quants::extra`]; `extra` is what it returned for this block.
    unsafe fn unpack_pair(qs: *const u8, jj: usize, extra: __m256i) -> [__m256i; 2];
    /// Block `b`'s scales for the 8 rows of half `half` of the panel at `panel`: the scale of weights 0..16 and of
    /// weights 16..32 (the same unless the format splits halves), and the offset (0 without one), as
    /// [`crate::packed::PackedView::scale`] and `m` state them.
    ///
    /// # Safety
    /// `panel` must be a checked panel with sections `sec`, `b` one of its blocks; the CPU must have AVX2 and F16C.
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize, half: usize) -> ([__m256; 2], __m256) {
        // SAFETY: 16 bytes of f16 scales (and offsets) per block and half, 16-byte aligned, by the caller's
        // contract.
        unsafe {
            let d = _mm256_cvtph_ps(_mm_load_si128(panel.add(sec.d(b) + 16 * half).cast()));
            let m = if Self::FORMAT.has_min() {
                _mm256_cvtph_ps(_mm_load_si128(panel.add(sec.m(b) + 16 * half).cast()))
            } else {
                _mm256_setzero_ps()
            };
            ([d, d], m)
        }
    }
}

/// Eight integer scales (bytes, zero- or sign-extended) as f32.
///
/// # Safety
/// Eight bytes must be readable at `p`; the CPU must have AVX2.
#[inline(always)]
unsafe fn scale8<const SIGNED: bool>(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract; no alignment requirement.
    unsafe {
        let v = _mm_loadl_epi64(p.cast());
        _mm256_cvtepi32_ps(if SIGNED { _mm256_cvtepi8_epi32(v) } else { _mm256_cvtepu8_epi32(v) })
    }
}

/// Half `half` of a K format's f16 super-block scale line (at byte `at` of the panel), as f32.
///
/// # Safety
/// As [`Quants::scales`]; `at` is a line of the panel's [`Sections`].
#[inline(always)]
unsafe fn super_scale(panel: *const u8, at: usize, half: usize) -> __m256 {
    // SAFETY: the caller's contract: a 32-byte aligned line of 16 f16, of which this half is 16 bytes.
    unsafe { _mm256_cvtph_ps(_mm_load_si128(panel.add(at + 16 * half).cast())) }
}

struct Q4;
struct Q5;
struct Q8;
struct K4;
struct K6;

impl Quants for Q4 {
    const FORMAT: PackedFormat = PackedFormat::Q4;
    const TOP_QUANT: i32 = 15;
    /// SmolLM2 Q4_1 layers alone (kernel bench `curve`, one thread, medians of 9 alternated rounds), widened → byte
    /// tiles: 2 rows 71 → 116, 3 87 → 114, 4 93 → 115, 6 109 → 117, 8 115 → 118, 12 125 → 115, 16 122 → 118.
    /// Whole model (`--batch`, with its Q8_0 output head, 6 rounds): 2 84 → 121, 4 123 → 135, 6 136 → 151, 8 151 →
    /// 147.
    const SMALL_BATCH: usize = 6;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m256i) -> [__m256i; 2] {
        // SAFETY: the caller guarantees the half's aligned bytes and the features.
        unsafe {
            let mask = _mm256_set1_epi8(0x0F);
            let v = _mm256_load_si256(qs.add(64 * jj).cast());
            [_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16(v, 4), mask)]
        }
    }
}

/// Per-byte test masks: bit `i` (or `4 + i`) in byte `i`.
const BITS: [i32; 2] = [0x0804_0201, 0x8040_2010_u32 as i32];

impl Quants for Q5 {
    const FORMAT: PackedFormat = PackedFormat::Q5;
    const TOP_QUANT: i32 = 31;
    // No small batches: its two registers of sums per half and part spill in a tile of two rows (SmolLM2 Q5_0
    // requantized from Q4_1, widened → byte tiles: 2 rows 82 → 71, 3 99 → 81, 4 113 → 83).
    #[inline(always)]
    unsafe fn extra(qs: *const u8) -> __m256i {
        // SAFETY: the caller guarantees the block's bytes: the high bits' chunk follows the four nibble chunks.
        unsafe { _mm256_load_si256(qs.add(256).cast()) }
    }
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, qh: __m256i) -> [__m256i; 2] {
        // SAFETY: as for Q4; the high bits come from `qh`.
        unsafe {
            let mut u = Q4::unpack_pair(qs, jj, qh);
            // `vpshufb` indexes bytes within each 128-bit lane: dword w of a lane starts at byte 4w.
            let (a, b, c) = (0x0404_0404, 0x0808_0808, 0x0C0C_0C0C);
            let dword_base = _mm256_set_epi32(c, b, a, 0, c, b, a, 0);
            for (half, uj) in u.iter_mut().enumerate() {
                // The group's weights start at bit s of the row's qh: byte s/8 holds their four bits at s%8.. .
                let s = 4 * jj + 16 * half;
                // Copy that byte of each row's dword to all four of its bytes, keep one bit per byte, and where it
                // is set add 16.
                let spread = _mm256_shuffle_epi8(qh, _mm256_add_epi8(dword_base, _mm256_set1_epi8((s / 8) as i8)));
                let bits = _mm256_set1_epi32(BITS[(s % 8) / 4]);
                let hit = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
                *uj = _mm256_or_si256(*uj, _mm256_and_si256(hit, _mm256_set1_epi8(16)));
            }
            u
        }
    }
}

impl Quants for Q8 {
    const FORMAT: PackedFormat = PackedFormat::Q8;
    /// SmolLM2 Q8_0 (requantized from Q4_1), widened → tiles of two rows: 2 rows 75 → 112, 3 87 → 117, 4 95 →
    /// 126; 6 143 → 152 (noisy), 8 156 → 147, 12 163 → 145.
    const SMALL_BATCH: usize = 4;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m256i) -> [__m256i; 2] {
        // SAFETY: the caller guarantees the block's 512 aligned bytes and the features.
        unsafe { [_mm256_load_si256(qs.add(64 * jj).cast()), _mm256_load_si256(qs.add(64 * (jj + 4)).cast())] }
    }
}

impl Quants for K4 {
    const FORMAT: PackedFormat = PackedFormat::K4;
    const TOP_QUANT: i32 = 15;
    /// The nibble tile of Q4, so its limit. Gemma 3 Q4_K_M, whose Q8_0 output head (the tied embedding) takes most
    /// of a step, moved within the noise at 2, 4 and 8 rows with its Q4_K matrices alone changed (37 → 37, 53 → 54,
    /// 68 → 71).
    const SMALL_BATCH: usize = Q4::SMALL_BATCH;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, extra: __m256i) -> [__m256i; 2] {
        // SAFETY: the same nibble chunks as Q4.
        unsafe { Q4::unpack_pair(qs, jj, extra) }
    }
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize, half: usize) -> ([__m256; 2], __m256) {
        // SAFETY: the super-block lines and the 16-byte lines of integer scales and mins of block b, by the
        // caller's contract; this half's 8 bytes start at 8·half.
        unsafe {
            let d = _mm256_mul_ps(super_scale(panel, sec.d(b), half), scale8::<false>(panel.add(sec.sc(b) + 8 * half)));
            let m = _mm256_mul_ps(super_scale(panel, sec.m(b), half), scale8::<false>(panel.add(sec.mn(b) + 8 * half)));
            // −(dmin·mn), negated exactly (a sign flip, as the reference's unary minus).
            ([d, d], _mm256_xor_ps(m, _mm256_set1_ps(-0.0)))
        }
    }
}

impl Quants for K6 {
    const FORMAT: PackedFormat = PackedFormat::K6;
    /// Two-row tiles through the same in-register widening as Q8; the limit of 3 comes from a sweep whose gains were
    /// not Q6_K's (below). Gemma 3 Q4_K_M's Q6_K matrices are its FFN down projections, a small share of a step: with
    /// this limit alone at 0 or 3, its batches of 2 and 3 moved within the noise (tokens per CPU-second, medians of 3
    /// alternated rounds: 56.6 / 54.0 and 59.9 / 63.3). The gains once given here (2 rows 37 → 50, 3 48 → 56) do not
    /// appear with this limit alone; most of a step is the Q8_0 output head (the tied embedding, 262,144 rows), under
    /// `Q8`'s.
    const SMALL_BATCH: usize = 3;
    #[inline(always)]
    unsafe fn unpack_pair(qs: *const u8, jj: usize, _: __m256i) -> [__m256i; 2] {
        // SAFETY: the nibble chunk jj and the bit-pair chunk 4 + jj/2 of the block, by the caller's contract.
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let top = _mm256_set1_epi8(0x30);
            let v = _mm256_load_si256(qs.add(64 * jj).cast());
            let h = _mm256_load_si256(qs.add(64 * (4 + jj / 2)).cast());
            // This chunk's bit pairs sit at bits 0..4 (even jj) or 4..8 (odd jj) of each byte, the low nibbles'
            // first: move each pair to bits 4..6 (16-bit shifts; the mask drops what crosses a byte).
            let (hl, hh) = if jj.is_multiple_of(2) {
                (_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2))
            } else {
                (h, _mm256_srli_epi16(h, 2))
            };
            [
                _mm256_or_si256(_mm256_and_si256(v, low), _mm256_and_si256(hl, top)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), _mm256_and_si256(hh, top)),
            ]
        }
    }
    #[inline(always)]
    unsafe fn scales(panel: *const u8, sec: &Sections, b: usize, half: usize) -> ([__m256; 2], __m256) {
        // SAFETY: the super-block line and the two 16-byte lines of block b's half-block scales, by the
        // caller's contract.
        unsafe {
            let d = super_scale(panel, sec.d(b), half);
            let sc = |part: usize| scale8::<true>(panel.add(sec.sc(b) + 16 * part + 8 * half));
            ([_mm256_mul_ps(d, sc(0)), _mm256_mul_ps(d, sc(1))], _mm256_setzero_ps())
        }
    }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn panel(
    w: PackedView<'_>,
    panels: Range<usize>,
    act: Act32<'_>,
    n_act: usize,
    group: usize,
    out: &OutSink<'_>,
) {
    check_args(&w, &panels, &act, n_act, group);
    // SAFETY (all six): the arguments were checked above and the caller has the features.
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
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<F: Quants, const G: usize>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    act: &Act32<'_>,
    n_out: usize,
    out: &OutSink<'_>,
) {
    let mut a16 = ACT16.take();
    let mut o0 = 0;
    while o0 < n_out {
        let o1 = (o0 + ACT_CHUNK).min(n_out);
        a16.fill::<G>(act, w.nb, o0..o1, F::FORMAT.split_halves());
        if o1 - o0 == 1 {
            // Decode: one panel (both halves) per tile, streaming the weights. (Two panels per tile keep more
            // activation broadcasts live than there are registers; one half per tile reads each line twice.)
            // Each decode tile prefetches the panel after its own (see `tile`); the task's first panel is
            // fetched here.
            prefetch_lines(w.bytes.as_ptr().wrapping_add(panels.start * w.panel_bytes), 0..w.panel_bytes / 64);
            for p in panels.clone() {
                // SAFETY: p is one of the checked panels; output row 0 of the chunk exists.
                unsafe { tile::<F, G, 1, 2>(w, 2 * p, &a16, act, 0, o0, true, out) };
            }
        } else if (G == 1 && byte_tiled::<F>()) || (G == 2 && o1 - o0 <= F::SMALL_BATCH) {
            // SAFETY: as below.
            unsafe { row_tiles::<F, G>(w, panels.clone(), &a16, act, o1 - o0, o0, out) };
        } else {
            // SAFETY: the panels are checked and rows 0..o1 - o0 of the chunk are filled.
            unsafe { wide_tiles::<F>(w, panels.clone(), &a16, o1 - o0, o0, out) };
        }
        o0 = o1;
    }
    ACT16.set(a16);
}

/// Repeats `body` with `c` bound to each constant `0..C` (`C` ≤ 6) so that `[_; C]` accumulators indexed by `c`
/// become registers.
macro_rules! for_each_c {
    ($C:ident, $c:ident, $body:block) => {
        for_each_c!(@ $C, $c, $body, 0 1 2 3 4 5)
    };
    (@ $C:ident, $c:ident, $body:block, $($i:literal)*) => {
        $( if $i < $C { let $c: usize = $i; $body } )*
    };
}

/// Halves `sp..sp + S` (half `h` is rows `8·(h % 2)..` of panel `h / 2`) against output rows `o..o + C` of the
/// chunk in `a16`, whose first row is output row `o_base`. `stream`: prefetch the next panel (decode, and the
/// first tile of each panel in [`row_tiles`]).
///
/// # Safety
/// As [`run`], with the halves inside the checked panels and `o + C` rows filled in `a16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Quants, const G: usize, const C: usize, const S: usize>(
    w: &PackedView<'_>,
    sp: usize,
    a16: &Act16,
    act: &Act32<'_>,
    o: usize,
    o_base: usize,
    stream: bool,
    out: &OutSink<'_>,
) {
    const { assert!(C >= 1 && C <= 4 && (S == 1 || S == 2 || S == 4)) };
    let nb = w.nb;
    let cols = nb * 32;
    // SAFETY: all pointer arithmetic stays inside the halves' panels (the offsets of `Sections` for nb blocks:
    // `panel_bytes` covers them, checked by `check_args`) and inside rows o..o + C of
    // the activation buffer, which the caller filled.
    unsafe {
        // Half h of the matrix is rows 8·(h % 2).. of panel h / 2: its quants start 32·(h % 2) bytes into each
        // chunk.
        let panel: [*const u8; S] = std::array::from_fn(|s| w.bytes.as_ptr().add((sp + s) / 2 * w.panel_bytes));
        let half: [usize; S] = std::array::from_fn(|s| (sp + s) % 2);
        let base: [*const u8; S] = std::array::from_fn(|s| panel[s].add(32 * half[s]));
        // From the format constant, so that every offset below is a few operations on constants.
        let sec = Sections::of(F::FORMAT, nb);
        let aq: [*const i16; C] = std::array::from_fn(|c| a16.q.as_ptr().add((o + c) * cols));
        // The same rows' 8-bit parts as `act` holds them (part g of output row r is activation row G·r + g), for
        // the byte products.
        let a8: [[*const i8; G]; C] =
            std::array::from_fn(|c| std::array::from_fn(|g| act.qs.as_ptr().add(((o_base + o + c) * G + g) * cols)));
        let ad: [*const f32; C] = std::array::from_fn(|c| a16.d.as_ptr().add((o + c) * nb));
        let asum: [*const f32; C] = std::array::from_fn(|c| a16.s.as_ptr().add((o + c) * nb));
        let ai: [*const i32; C] = std::array::from_fn(|c| a16.isum.as_ptr().add((o + c) * nb));
        let ah: [*const i32; C] = std::array::from_fn(|c| a16.hsum.as_ptr().wrapping_add(2 * (o + c) * nb));
        let off = F::FORMAT.offset();
        let split = F::FORMAT.split_halves();
        let low = _mm256_set1_epi16(0x00FF);
        let mut acc = [[_mm256_setzero_ps(); C]; S];
        // Lines of the next panel each block fetches: enough that the nb blocks cover it (the last blocks may reach
        // into the panel after it, a harmless hint).
        let per_block = (w.panel_bytes / 64).div_ceil(nb);
        let mut next = panel[0].wrapping_add(w.panel_bytes);
        for b in 0..nb {
            if stream {
                // Decode streams the weights from memory once. A prefetch distance counted from the quants (4 KB
                // ahead, as before) never reached a panel's scale and offset lines in time: they sit after its
                // quants but are read from its first block on, and the instruction after their load held 30%
                // (Q4) and 27% (Q8) of the tile's cpu-clock samples. So each block fetches its share of the *next*
                // panel's lines, all of them, in order: 1.4-1.6× decode tokens per CPU-second on SmolLM2 Q4_0.
                // Q8 panels go to L2, not L1: one of the FFN-down matrix is 26 KB, which with the panel in use
                // overflows Zen 4's 32 KB L1D (the AVX-512 kernel's finding too); perf put ~22% of the Q8_0 decode
                // tile's cpu-clock samples on the `prefetcht0`s. SmolLM2 Q8_0 tg64, 2 threads, per CPU-second,
                // 4 interleaved pairs on a loaded host: +12% to +36% in every pair. The 4-bit panels (15 KB) fit:
                // into L2, Q4_1 lost in 3 of 4 pairs, so they stay in L1. With the panel one stream (Zen 5, 48 KB
                // L1D, tg128 on 2 threads, median of 5-8 interleaved rounds on a loaded host) this stayed the
                // choice: no prefetch lost everywhere (Q8_0 177 t/s against 203, Gemma 3 84 against 104), the
                // panel after next gained nothing, and Q8_0 into L1 (201-206 against 172-203) was within the noise
                // on this core, whose L1D is not the 32 KB of the Zen 2/3 cores this level is for.
                if matches!(F::FORMAT, PackedFormat::Q8) {
                    prefetch_l2(next, 0..per_block);
                } else {
                    prefetch_lines(next, 0..per_block);
                }
                next = next.wrapping_add(64 * per_block);
            }
            let qp: [*const u8; S] = std::array::from_fn(|s| base[s].add(sec.qs(b)));
            let extra: [__m256i; S] = std::array::from_fn(|s| F::extra(qp[s]));
            // One 32-bit lane per row: the exact integer sum of the block's products (of each half block's, for
            // formats that scale them separately).
            let mut iv = [[[_mm256_setzero_si256(); C]; S]; 2];
            // `nibble_block` unpacks nibbles itself: Q4 and K4, the formats of `byte_tiled`, against 3 or 4 rows
            // of bytes (each part of each row: 3 rows of `q8`, 2 of `q8x2`).
            if S == 2 && matches!(G * C, 3 | 4) && matches!(F::FORMAT, PackedFormat::Q4 | PackedFormat::K4) {
                // (`1 % S` only lets the other instances of this generic code compile; here it is 1.)
                let qp2 = [qp[0], qp[1 % S]];
                if G * C == 3 {
                    nibble_sums::<G, C, S, 3>(qp2, &a8, b << 5, &mut iv);
                } else {
                    nibble_sums::<G, C, S, 4>(qp2, &a8, b << 5, &mut iv);
                }
            } else if F::TOP_QUANT > 0 {
                byte_products::<F, G, C, S>(qp, extra, &a8, b << 5, &mut iv);
            } else {
                for jj in 0..4 {
                    for s in 0..S {
                        let u = F::unpack_pair(qp[s], jj, extra[s]);
                        for (part, up) in u.iter().enumerate() {
                            // Each row's bytes w0 w1 w2 w3 as 16-bit (w0, w2) and (w1, w3).
                            let (even, odd) = (_mm256_and_si256(*up, low), _mm256_srli_epi16(*up, 8));
                            let k = (b << 5) + 4 * jj + 16 * part;
                            let into = if split { part } else { 0 };
                            for_each_c!(C, c, {
                                let pair = aq[c].add(k).cast::<i32>();
                                let (ae, ao) = (
                                    _mm256_set1_epi32(pair.read_unaligned()),
                                    _mm256_set1_epi32(pair.add(1).read_unaligned()),
                                );
                                let p = _mm256_add_epi32(_mm256_madd_epi16(even, ae), _mm256_madd_epi16(odd, ao));
                                iv[into][s][c] = _mm256_add_epi32(iv[into][s][c], p);
                            });
                        }
                    }
                }
            }
            for s in 0..S {
                let (dw, mw) = F::scales(panel[s], &sec, b, half[s]);
                for_each_c!(C, c, {
                    let da = _mm256_set1_ps(*ad[c].add(b));
                    for part in 0..1 + usize::from(split) {
                        let mut v = iv[part][s][c];
                        if off != 0 {
                            let sum = if split { *ah[c].add(2 * b + part) } else { *ai[c].add(b) };
                            v = _mm256_add_epi32(v, _mm256_set1_epi32((-off).wrapping_mul(sum)));
                        }
                        let scale = _mm256_mul_ps(dw[part], da);
                        acc[s][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), scale, acc[s][c]);
                    }
                    if F::FORMAT.has_min() {
                        acc[s][c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*asum[c].add(b)), acc[s][c]);
                    }
                });
            }
        }
        for (s, half_acc) in acc.iter().enumerate() {
            for (c, v) in half_acc.iter().enumerate() {
                let mut lanes = [0f32; HALF];
                _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                out.put_row(o_base + o + c, (sp + s) * HALF, &lanes);
            }
        }
    }
}

/// One block of the decode tile by `vpmaddubsw`, for formats with a [`Quants::TOP_QUANT`]: the integer sums `iv`
/// (as [`tile`] lays them out) from the weights' unsigned bytes and each activation part's signed bytes, with no
/// widening of the weights. A register of 16-bit pair sums per half and activation part collects as many groups
/// of four weights as fit below 2^15 (a pair sum is at most 2 · top · 128: the whole block for the 4-bit formats,
/// half of it for Q5, whose sums are split by the part of the block they belong to; so are the formats that scale
/// the parts separately), and one `vpmaddwd` against 256 (the first part of Q8x2) or 1 turns it into each row's
/// 32-bit sum. That is `256·Σw·q1 + Σw·q2`, exactly the sum the widened path forms from the combined values
/// `256·q1 + q2`, so the results do not change by a bit. Per register of weights: 2 multiplies and 2 adds (with
/// Q8x2), where the widened path spends 2 widening operations, 2 multiplies and 2 adds, and the block's end costs
/// 2 multiplies and 2 adds per half and register of sums. One thread once ran Q4_1 panels of an L2-resident
/// matrix at about 24-27 G multiply-adds/s this way, AVX-512 at 42; on Zen 4 (2026-12-04, 1536×576 against one
/// `q8x2` row, best of 40 runs, two runs) Q4_1 ran at 51, Q4_0 at 36-52 and Q5_0 at 27: the 4-bit formats now
/// outrun one core's share of memory, while Q5_0, whose high bits cost 5 operations per register to merge, is
/// still short of instructions.
///
/// # Safety
/// As [`tile`]: `qp` and `extra` as there for block `k / 32`; `a8` the tile's rows' parts, each with `k + 32` bytes.
#[inline(always)]
unsafe fn byte_products<F: Quants, const G: usize, const C: usize, const S: usize>(
    qp: [*const u8; S],
    extra: [__m256i; S],
    a8: &[[*const i8; G]; C],
    k: usize,
    iv: &mut [[[__m256i; C]; S]; 2],
) {
    const { assert!(G == 1 || G == 2) };
    // Groups of four per register of sums: 8 (the whole block) or 4 (one part).
    let whole = whole_block_sums::<F>();
    const { assert!(4 * 2 * F::TOP_QUANT * 128 <= i16::MAX as i32) };
    let regs = if whole { 1 } else { 2 };
    // SAFETY: the caller's contract; the activation reads are unaligned 4-byte loads inside the rows.
    unsafe {
        let mut sums = [[[[_mm256_setzero_si256(); G]; C]; 2]; S];
        for jj in 0..4 {
            for s in 0..S {
                let u = F::unpack_pair(qp[s], jj, extra[s]);
                for (part, up) in u.iter().enumerate() {
                    let at = k + 4 * jj + 16 * part;
                    let r = if whole { 0 } else { part };
                    for_each_c!(C, c, {
                        for g in 0..G {
                            let x = _mm256_set1_epi32(a8[c][g].add(at).cast::<i32>().read_unaligned());
                            sums[s][r][c][g] = _mm256_add_epi16(sums[s][r][c][g], _mm256_maddubs_epi16(*up, x));
                        }
                    });
                }
            }
        }
        for s in 0..S {
            for r in 0..regs {
                let into = if F::FORMAT.split_halves() { r } else { 0 };
                for_each_c!(C, c, {
                    iv[into][s][c] = _mm256_add_epi32(iv[into][s][c], part_sums(sums[s][r][c]));
                });
            }
        }
    }
}

/// One row's 16-bit pair sums, a register per activation part, as its 32-bit sums: with `q8x2` (`G = 2`) the
/// first part's count 256 times (`256·Σw·q1 + Σw·q2`), with `q8` they are the sums themselves. One `vpmaddwd` per
/// part does the widening.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn part_sums<const G: usize>(parts: [__m256i; G]) -> __m256i {
    // SAFETY: the caller has the features.
    unsafe {
        let mut v = _mm256_madd_epi16(parts[0], _mm256_set1_epi16(if G == 2 { 256 } else { 1 }));
        if G == 2 {
            v = _mm256_add_epi32(v, _mm256_madd_epi16(parts[G - 1], _mm256_set1_epi16(1)));
        }
        v
    }
}

/// [`nibble_block`] over the `R = G·C` rows of bytes of a tile's `C` rows (part `g` of row `c` is byte row
/// `G·c + g`), added into the tile's 32-bit sums `iv` by [`part_sums`], as [`byte_products`] adds them.
///
/// # Safety
/// As [`nibble_block`]; `R` must be `G·C` and `S` 2.
#[inline(always)]
unsafe fn nibble_sums<const G: usize, const C: usize, const S: usize, const R: usize>(
    qp: [*const u8; 2],
    a8: &[[*const i8; G]; C],
    k: usize,
    iv: &mut [[[__m256i; C]; S]; 2],
) {
    debug_assert!(R == G * C && S == 2);
    // SAFETY: the caller's contract.
    unsafe {
        let sums = nibble_block::<R>(qp, std::array::from_fn(|r| a8[r / G][r % G]), k);
        for s in 0..2 {
            for_each_c!(C, c, {
                let v = part_sums::<G>(std::array::from_fn(|g| sums[s][G * c + g]));
                iv[0][s % S][c] = _mm256_add_epi32(iv[0][s % S][c], v);
            });
        }
    }
}

/// [`byte_products`] in assembly for the nibble formats (Q4, K4, the formats of [`byte_tiled`]) and both halves of a
/// panel, against `R` rows of 8-bit activations: the 3 rows of a `--precision q8` tile, or the two parts of each of the
/// 2 rows of a `q8x2` tile of a small batch (4). Per pair of groups, the two halves' chunks are unpacked into 4
/// registers of weight bytes, and for each part and row one broadcast meets both halves, a `vpmaddubsw` and a 16-bit
/// add each; the 2·R registers of sums, the 4 of weights, the mask, the broadcast and the product take at most 15 of
/// the 16 registers. Compiled from `byte_products`, LLVM unpacked ahead and kept the weight registers on the stack,
/// about 70 stack accesses per block of 48 `vpmaddubsw` (about 18 with this, the float accumulators and pointers
/// between blocks). The sums are the same integers, so the results do not change by a bit. (Decode's 2 rows of bytes
/// gain nothing from it: SmolLM2's Q4_1 layers on one thread, Zen 1, 98 tokens per CPU-second either way, medians of 9
/// alternated rounds.) Kernel alone (forced AVX2, one thread, 1536×576 or ×1024 panels against 48 rows at `q8`, best of
/// 40 interleaved runs, two runs, Zen 4), G multiply-adds/s: Q4_0 97.0 → 106.1 and 88.3 → 101.3, Q4_1 98.2 → 105.8 and
/// 98.3 → 107.9, Q4_K 90.2 → 94.2 and 64.5 → 66.6. Returns each half's and row's 16-bit pair sums: eight groups of
/// them, each at most 2 · 15 · 128, stay below 2^15 (as [`whole_block_sums`] states).
///
/// # Safety
/// `qp` as in [`tile`] (block `k / 32` of both halves), each `a8[r]` a row of 8-bit activations with `k + 32`
/// readable bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_block<const R: usize>(qp: [*const u8; 2], a8: [*const i8; R], k: usize) -> [[__m256i; R]; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let a = a8.map(|p| p.add(k));
        let mut sums = [[_mm256_setzero_si256(); R]; 2];
        let sums_r = (&raw mut sums).cast::<()>();
        // Each instance below is called only with its own R: the casts restate the array's length.
        macro_rules! steps {
            ($step:ident, $n:literal) => {{
                let a = *(&raw const a).cast::<[*const i8; $n]>();
                let sums = &mut *sums_r.cast::<[[__m256i; $n]; 2]>();
                $step::<0>(qp, a, mask, sums);
                $step::<1>(qp, a, mask, sums);
                $step::<2>(qp, a, mask, sums);
                $step::<3>(qp, a, mask, sums);
            }};
        }
        match R {
            3 => steps!(nibble_step3, 3),
            4 => steps!(nibble_step4, 4),
            _ => unreachable!("nibble_block takes 3 or 4 rows"),
        }
        sums
    }
}

/// Defines `$name::<JJ>`: one pair of weight groups (`JJ` and `JJ + 4`) of [`nibble_block`] against the rows
/// listed, each as `pointer operand: sum operand of half 0, of half 1, index`.
///
/// # Safety (of the functions it defines)
/// As [`nibble_block`], with `a` the rows' activations at the block's first value: 64·JJ + 32 bytes of each
/// half's chunk, 32-byte aligned, and 4 bytes at 4·JJ and 16 + 4·JJ of each row.
macro_rules! nibble_step {
    ($name:ident, $n:literal, [$($a:ident: $s0:ident, $s1:ident, $i:literal);+]) => {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn $name<const JJ: usize>(
            qp: [*const u8; 2],
            a: [*const i8; $n],
            mask: __m256i,
            sums: &mut [[__m256i; $n]; 2],
        ) {
            // SAFETY: the caller's contract (see the macro).
            unsafe {
                std::arch::asm!(
                    // Both halves' chunk: the low nibbles are groups JJ, the high ones groups JJ + 4 (see `Q4`).
                    "vmovdqa {u01}, ymmword ptr [{q0} + {qo}]",
                    "vmovdqa {u11}, ymmword ptr [{q1} + {qo}]",
                    "vpand {u00}, {u01}, {mask}",
                    "vpand {u10}, {u11}, {mask}",
                    "vpsrlw {u01}, {u01}, 4",
                    "vpsrlw {u11}, {u11}, 4",
                    "vpand {u01}, {u01}, {mask}",
                    "vpand {u11}, {u11}, {mask}",
                    // Part 0 (the low nibbles) against each row's values 4·JJ.., both halves.
                    $(
                        concat!("vpbroadcastd {x}, dword ptr [{", stringify!($a), "} + {ao}]"),
                        "vpmaddubsw {t}, {u00}, {x}",
                        concat!("vpaddw {", stringify!($s0), "}, {", stringify!($s0), "}, {t}"),
                        "vpmaddubsw {t}, {u10}, {x}",
                        concat!("vpaddw {", stringify!($s1), "}, {", stringify!($s1), "}, {t}"),
                    )+
                    // Part 1 (the high nibbles) against values 16 + 4·JJ...
                    $(
                        concat!("vpbroadcastd {x}, dword ptr [{", stringify!($a), "} + {ao} + 16]"),
                        "vpmaddubsw {t}, {u01}, {x}",
                        concat!("vpaddw {", stringify!($s0), "}, {", stringify!($s0), "}, {t}"),
                        "vpmaddubsw {t}, {u11}, {x}",
                        concat!("vpaddw {", stringify!($s1), "}, {", stringify!($s1), "}, {t}"),
                    )+
                    qo = const 64 * JJ,
                    ao = const 4 * JJ,
                    q0 = in(reg) qp[0],
                    q1 = in(reg) qp[1],
                    $($a = in(reg) a[$i],)+
                    mask = in(ymm_reg) mask,
                    $($s0 = inout(ymm_reg) sums[0][$i], $s1 = inout(ymm_reg) sums[1][$i],)+
                    u00 = out(ymm_reg) _,
                    u01 = out(ymm_reg) _,
                    u10 = out(ymm_reg) _,
                    u11 = out(ymm_reg) _,
                    x = out(ymm_reg) _,
                    t = out(ymm_reg) _,
                    options(nostack, pure, readonly),
                );
            }
        }
    };
}

nibble_step!(nibble_step3, 3, [a0: s00, s10, 0; a1: s01, s11, 1; a2: s02, s12, 2]);
nibble_step!(nibble_step4, 4, [a0: s00, s10, 0; a1: s01, s11, 1; a2: s02, s12, 2; a3: s03, s13, 3]);

/// Whether batches of 8-bit activations take [`row_tiles`]: the formats whose half blocks fit one register of
/// 16-bit sums (Q4_0, Q4_1, Q4_K), so that a tile holds three rows. With two registers per half (Q5_0) a tile holds
/// two rows, and that measured slower than the widened path (SmolLM2 Q5_0 pp512 at `--precision q8`, forced
/// AVX2, 2 threads: 339 → 357 and 353 → 309 in two interleaved pairs; Gemma 3 Q4_K_M, whose attention query and key
/// and FFN gate and up matrices are Q5_0, 433 → 360 and 517 → 396).
const fn byte_tiled<F: Quants>() -> bool {
    F::TOP_QUANT > 0 && whole_block_sums::<F>()
}

/// Whether one register of 16-bit sums in [`byte_products`] holds a half's whole block: the parts need not stay
/// apart (the format scales the block as one) and eight groups of four pair sums (at most 2 · top · 128 each) stay
/// below 2^15.
const fn whole_block_sums<F: Quants>() -> bool {
    !F::FORMAT.split_halves() && 8 * 2 * F::TOP_QUANT * 128 <= i16::MAX as i32
}

/// Batches of 8-bit activations (`--precision q8`, `G = 1`) for the formats of [`byte_tiled`], and small batches of
/// `q8x2` ones (`G = 2`, at most [`Quants::SMALL_BATCH`] rows) for any format: the decode tile over three rows (`q8`)
/// or two (`q8x2`, whose two parts make four rows of bytes for [`nibble_block`]) at a time, each panel passing all the
/// chunk's rows while it stays in L1, with no widened copy. With one 8-bit part per activation, a register of weight
/// bytes costs one `vpmaddubsw` and one 16-bit add per row (32 multiply-adds), half of what the widened 16-bit path
/// spends, which is what this precision is for; a tile holds 6 registers of sums and 6 float accumulators. SmolLM2
/// pp512 at `--precision q8`, forced AVX2, 2 threads, two interleaved pairs on a loaded host: Q4_1 326 → 379 and 353 →
/// 584, Q4_0 307 → 353 and 448 → 514.
///
/// # Safety
/// As [`wide_tiles`], with `act` the checked activations the chunk was filled from.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_tiles<F: Quants, const G: usize>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    a16: &Act16,
    act: &Act32<'_>,
    n: usize,
    o_base: usize,
    out: &OutSink<'_>,
) {
    for p in panels {
        let mut o = 0;
        while o < n {
            // At most 4 rows of bytes (see `nibble_block`) and 3 rows.
            let c = (n - o).min(if G == 1 { 3 } else { 2 });
            // The panel's first tile fetches the next panel while it runs (see `tile`).
            let first = o == 0;
            // SAFETY: p is a checked panel and rows o..o + c of the chunk are filled.
            unsafe {
                match c {
                    3 => tile::<F, G, 3, 2>(w, 2 * p, a16, act, o, o_base, first, out),
                    2 => tile::<F, G, 2, 2>(w, 2 * p, a16, act, o, o_base, first, out),
                    _ => tile::<F, G, 1, 2>(w, 2 * p, a16, act, o, o_base, first, out),
                }
            }
            o += c;
        }
    }
}

/// Batches (more than one output row): each panel's blocks are widened to 16-bit weights once per chunk of
/// output rows, [`WIDE_BLOCKS`] at a time, into an L1 scratch that every [`tile_w`] of the chunk then reads as
/// memory operands. Unpacking and widening, which the decode tile pays per use, are paid once per 48 rows, and the
/// registers they took hold a whole panel (both halves) of accumulators instead, so each activation broadcast
/// serves 16 rows. Callgrind, SmolLM2 Q4_0 pp128 on one thread: the 4-row × 8-row tile ran 3.77 G instructions,
/// about 3.6 multiply-adds each.
///
/// # Safety
/// As [`run`]; rows `0..n` of `a16` are filled and are output rows `o_base..o_base + n`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn wide_tiles<F: Quants>(
    w: &PackedView<'_>,
    panels: Range<usize>,
    a16: &Act16,
    n: usize,
    o_base: usize,
    out: &OutSink<'_>,
) {
    let (mut wide, mut accs) = WIDE.take();
    wide.resize(wide.len().max(WIDE_BLOCKS * WIDE_PER_BLOCK), _mm256_setzero_si256());
    accs.resize(accs.len().max(n), [_mm256_setzero_ps(); 2]);
    let nb = w.nb;
    // Tiles per panel, each of which fetches its share of the next panel.
    let tiles = nb.div_ceil(WIDE_BLOCKS) * n.div_ceil(TILE_W);
    for p in panels.clone() {
        accs[..n].fill([_mm256_setzero_ps(); 2]);
        // `widen` reads a panel in bursts, a chunk at a time between long runs of tiles, and waited on memory with
        // the hardware prefetcher alone (perf, SmolLM2 Q4_1 B=16 on one thread: 18% of the Q4_1 samples of this
        // function in `widen`, on the instructions after its loads). So the tiles of panel p fetch panel p + 1
        // (of this task; the last panel fetches nothing) into L2, spread over them, while they compute. SmolLM2
        // Q4_1 `bench --batch 16 -t 1`, forced AVX2, tokens per CPU-second over 3 interleaved rounds on a loaded
        // host: 425-435 → 517-521.
        let next = w.bytes.as_ptr().wrapping_add((p + 1) * w.panel_bytes);
        let lines = if p + 1 < panels.end { w.panel_bytes / 64 } else { 0 };
        let per_tile = lines.div_ceil(tiles);
        let mut fetched = 0;
        let mut b0 = 0;
        while b0 < nb {
            let b1 = (b0 + WIDE_BLOCKS).min(nb);
            // SAFETY: p is a checked panel, b0..b1 its blocks, and `wide` holds WIDE_BLOCKS blocks.
            unsafe { widen::<F>(w, p, b0..b1, wide.as_mut_ptr()) };
            let mut o = 0;
            while o < n {
                let to = (fetched + per_tile).min(lines);
                prefetch_l2(next, fetched..to);
                fetched = to;
                let acc = &mut accs[o..];
                // SAFETY (all): rows o..o + C are filled; the blocks were widened above.
                match n - o {
                    1 => unsafe { tile_w::<F, 1>(w, p, b0..b1, &wide, a16, o, acc) },
                    2 => unsafe { tile_w::<F, 2>(w, p, b0..b1, &wide, a16, o, acc) },
                    _ => unsafe { tile_w::<F, TILE_W>(w, p, b0..b1, &wide, a16, o, acc) },
                }
                o += (n - o).min(TILE_W);
            }
            b0 = b1;
        }
        for (o, v) in accs[..n].iter().enumerate() {
            let mut lanes = [0f32; PANEL_ROWS];
            // SAFETY: 16 writable f32.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(HALF), v[1]);
            }
            out.put_row(o_base + o, p * PANEL_ROWS, &lanes);
        }
    }
    WIDE.set((wide, accs));
}

/// Widens blocks `blocks` of panel `p` into `dst`: per block, half, pair of groups `jj` and part (see
/// [`Quants::unpack_pair`]), the rows' weights as 16-bit `(w0, w2)` and `(w1, w3)` with the format's offset
/// already taken out (exact: the integer sums are the same as subtracting `offset · Σq` afterwards).
///
/// # Safety
/// `p` must be a checked panel, `blocks` inside it and at most [`WIDE_BLOCKS`] long, `dst` writable for that many
/// blocks of [`WIDE_PER_BLOCK`] registers; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen<F: Quants>(w: &PackedView<'_>, p: usize, blocks: Range<usize>, dst: *mut __m256i) {
    let low = _mm256_set1_epi16(0x00FF);
    let off = _mm256_set1_epi16(F::FORMAT.offset() as i16);
    // SAFETY: the block's quants lie inside panel p (checked by `check_args`); dst has room by the contract.
    unsafe {
        let panel = w.bytes.as_ptr().add(p * w.panel_bytes);
        let sec = Sections::of(F::FORMAT, w.nb);
        for (i, b) in blocks.enumerate() {
            for half in 0..2 {
                let qp = panel.add(sec.qs(b) + 32 * half);
                let extra = F::extra(qp);
                let d = dst.add(i * WIDE_PER_BLOCK + 16 * half);
                for jj in 0..4 {
                    let u = F::unpack_pair(qp, jj, extra);
                    for (part, up) in u.iter().enumerate() {
                        let (even, odd) = (_mm256_and_si256(*up, low), _mm256_srli_epi16(*up, 8));
                        let at = d.add(4 * jj + 2 * part);
                        at.write(_mm256_sub_epi16(even, off));
                        at.add(1).write(_mm256_sub_epi16(odd, off));
                    }
                }
            }
        }
    }
}

/// One pair of weight groups `(JJ, PART)` of a widened block against three rows: the products of [`tile_w`] for
/// `C = 3`, in assembly so that the register allocation is ours: 6 accumulators, the pair's 4 weight registers, 2
/// broadcasts and 2 products take 14 of the 16 registers, each weight is loaded once for the three rows, and
/// nothing spills. Compiled from the loop, LLVM hoisted two pairs' 8 weight loads and kept an accumulator on the
/// stack (a store and a reload per pair, on the accumulator's chain), and with Q6_K's two sets of sums (a tile of
/// 2 rows then) it spilled 149 times per 64 products.
///
/// Measured alone (kernel bench, forced AVX2, one thread, 1536×576 or ×1024 panels against 48 rows at `q8x2`,
/// best of 40 interleaved runs each, Zen 4): Q4_0 65.2 → 67.2 G multiply-adds/s, Q8_0 65.8 → 67.8, Q4_1 65.9 →
/// 67.4, Q5_0 65.4 → 67.2, Q4_K 61.0 → 63.3, Q6_K 22.8 → 59.8. The shape itself, alone in a loop, issues 5.0-5.5 G
/// `vpmaddwd`/s, where a bare stream of `vpmaddwd` + `vpaddd` pairs reaches 5.5 and `vpmaddwd` alone 7.2: so the
/// rest of the tile (the float epilogue per block, the widening) holds what remains between 67 and ~85.
///
/// # Safety
/// `wb` points at a widened block ([`WIDE_PER_BLOCK`] registers, 32-byte aligned); each `a[c]` at the block's
/// first 16-bit activation of row `c` (32 readable values). The CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn wide_step3<const JJ: usize, const PART: usize>(
    wb: *const __m256i,
    a: [*const i16; 3],
    iv: &mut [[__m256i; 3]; 2],
) {
    // SAFETY: the caller's contract; every read is inside the block or the rows' 32 values.
    unsafe {
        std::arch::asm!(
            // The pair's weights, both halves: (w0, w2) and (w1, w3) of rows 0..8, then of rows 8..16.
            "vmovdqa {w0}, ymmword ptr [{wb} + {wo}]",
            "vmovdqa {w1}, ymmword ptr [{wb} + {wo} + 32]",
            "vmovdqa {w2}, ymmword ptr [{wb} + {wo} + 512]",
            "vmovdqa {w3}, ymmword ptr [{wb} + {wo} + 544]",
            // Row c: its (a0, a2) and (a1, a3) broadcast, two products into each half's accumulator.
            "vpbroadcastd {be}, dword ptr [{a0} + {ao}]",
            "vpbroadcastd {bo}, dword ptr [{a0} + {ao} + 4]",
            "vpmaddwd {t0}, {w0}, {be}",
            "vpmaddwd {t1}, {w1}, {bo}",
            "vpaddd {s00}, {s00}, {t0}",
            "vpaddd {s00}, {s00}, {t1}",
            "vpmaddwd {t0}, {w2}, {be}",
            "vpmaddwd {t1}, {w3}, {bo}",
            "vpaddd {s10}, {s10}, {t0}",
            "vpaddd {s10}, {s10}, {t1}",
            "vpbroadcastd {be}, dword ptr [{a1} + {ao}]",
            "vpbroadcastd {bo}, dword ptr [{a1} + {ao} + 4]",
            "vpmaddwd {t0}, {w0}, {be}",
            "vpmaddwd {t1}, {w1}, {bo}",
            "vpaddd {s01}, {s01}, {t0}",
            "vpaddd {s01}, {s01}, {t1}",
            "vpmaddwd {t0}, {w2}, {be}",
            "vpmaddwd {t1}, {w3}, {bo}",
            "vpaddd {s11}, {s11}, {t0}",
            "vpaddd {s11}, {s11}, {t1}",
            "vpbroadcastd {be}, dword ptr [{a2} + {ao}]",
            "vpbroadcastd {bo}, dword ptr [{a2} + {ao} + 4]",
            "vpmaddwd {t0}, {w0}, {be}",
            "vpmaddwd {t1}, {w1}, {bo}",
            "vpaddd {s02}, {s02}, {t0}",
            "vpaddd {s02}, {s02}, {t1}",
            "vpmaddwd {t0}, {w2}, {be}",
            "vpmaddwd {t1}, {w3}, {bo}",
            "vpaddd {s12}, {s12}, {t0}",
            "vpaddd {s12}, {s12}, {t1}",
            // Register index 16·half + 4·JJ + 2·PART (+1 for the odd pair) of the block, 32 bytes each.
            wo = const 32 * (4 * JJ + 2 * PART),
            // Values 4·JJ + 16·PART of the row, 2 bytes each.
            ao = const 2 * (4 * JJ + 16 * PART),
            wb = in(reg) wb,
            a0 = in(reg) a[0],
            a1 = in(reg) a[1],
            a2 = in(reg) a[2],
            s00 = inout(ymm_reg) iv[0][0],
            s01 = inout(ymm_reg) iv[0][1],
            s02 = inout(ymm_reg) iv[0][2],
            s10 = inout(ymm_reg) iv[1][0],
            s11 = inout(ymm_reg) iv[1][1],
            s12 = inout(ymm_reg) iv[1][2],
            w0 = out(ymm_reg) _,
            w1 = out(ymm_reg) _,
            w2 = out(ymm_reg) _,
            w3 = out(ymm_reg) _,
            be = out(ymm_reg) _,
            bo = out(ymm_reg) _,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            options(nostack, pure, readonly),
        );
    }
}

/// Both halves of panel `p` over blocks `blocks` (widened into `wide` by [`widen`]) against output rows
/// `o..o + C` of the chunk in `a16`, adding into `acc[..C]` (each row's two halves). The float epilogue is the
/// decode tile's, so the results equal [`crate::packed::panel_ref`] bit for bit.
///
/// # Safety
/// As [`wide_tiles`]: rows `o..o + C` filled, `blocks` widened into `wide`, `acc` at least `C` long.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_w<F: Quants, const C: usize>(
    w: &PackedView<'_>,
    p: usize,
    blocks: Range<usize>,
    wide: &[__m256i],
    a16: &Act16,
    o: usize,
    acc_out: &mut [[__m256; 2]],
) {
    const { assert!(C >= 1 && C <= TILE_W) };
    let nb = w.nb;
    let cols = nb * 32;
    let split = F::FORMAT.split_halves();
    assert!(acc_out.len() >= C && wide.len() >= blocks.len() * WIDE_PER_BLOCK);
    // SAFETY: the activation pointers stay inside rows o..o + C of `a16` (filled by the caller), the widened
    // blocks inside `wide` (asserted), and the scale reads inside panel p (checked by `check_args`).
    unsafe {
        let panel = w.bytes.as_ptr().add(p * w.panel_bytes);
        let sec = Sections::of(F::FORMAT, nb);
        let aq: [*const i16; C] = std::array::from_fn(|c| a16.q.as_ptr().add((o + c) * cols));
        let ad: [*const f32; C] = std::array::from_fn(|c| a16.d.as_ptr().add((o + c) * nb));
        let asum: [*const f32; C] = std::array::from_fn(|c| a16.s.as_ptr().add((o + c) * nb));
        // The float accumulators live in `acc_out` (L1), read and written once per block: in registers they
        // left too few for the weights, and the compiler spilled those instead, inside the multiply loop
        // (callgrind: 4.0 multiply-adds per instruction against 5.5 planned).
        let accp: *mut __m256 = acc_out.as_mut_ptr().cast();
        let mut wb = wide.as_ptr();
        for b in blocks {
            // One 32-bit lane per row: the exact integer sum of the block's products (of each half block's, for
            // formats that scale them separately).
            let mut iv = [[[_mm256_setzero_si256(); C]; 2]; 2];
            if C == 3 {
                // (`% C` only lets the instances for 1 and 2 rows compile; here it leaves 1 and 2.)
                let a3 = [aq[0].add(b << 5), aq[1 % C].add(b << 5), aq[2 % C].add(b << 5)];
                // The first part's four pairs of groups, then the second's (into sums of their own where the format
                // scales the parts apart), so that only one set of 6 sums is being added to at a time.
                // SAFETY: C is 3, so iv[i] is a [[__m256i; 3]; 2]; the reads are the ones the loop below makes.
                let iv3 = &mut *(&raw mut iv[0]).cast::<[[__m256i; 3]; 2]>();
                wide_step3::<0, 0>(wb, a3, iv3);
                wide_step3::<1, 0>(wb, a3, iv3);
                wide_step3::<2, 0>(wb, a3, iv3);
                wide_step3::<3, 0>(wb, a3, iv3);
                let iv3 = &mut *(&raw mut iv[usize::from(split)]).cast::<[[__m256i; 3]; 2]>();
                wide_step3::<0, 1>(wb, a3, iv3);
                wide_step3::<1, 1>(wb, a3, iv3);
                wide_step3::<2, 1>(wb, a3, iv3);
                wide_step3::<3, 1>(wb, a3, iv3);
            } else {
                for jj in 0..4 {
                    for part in 0..2 {
                        let k = (b << 5) + 4 * jj + 16 * part;
                        let into = if split { part } else { 0 };
                        let wr = wb.add(4 * jj + 2 * part);
                        for_each_c!(C, c, {
                            let pair = aq[c].add(k).cast::<i32>();
                            let (ae, ao) = (
                                _mm256_set1_epi32(pair.read_unaligned()),
                                _mm256_set1_epi32(pair.add(1).read_unaligned()),
                            );
                            for s in 0..2 {
                                let ws = wr.add(16 * s);
                                let v = _mm256_add_epi32(_mm256_madd_epi16(*ws, ae), _mm256_madd_epi16(*ws.add(1), ao));
                                iv[into][s][c] = _mm256_add_epi32(iv[into][s][c], v);
                            }
                        });
                    }
                }
            }
            for s in 0..2 {
                let (dw, mw) = F::scales(panel, &sec, b, s);
                for_each_c!(C, c, {
                    let da = _mm256_set1_ps(*ad[c].add(b));
                    let at = accp.add(2 * c + s);
                    let mut acc = at.read_volatile();
                    for part in 0..1 + usize::from(split) {
                        let scale = _mm256_mul_ps(dw[part], da);
                        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv[part][s][c]), scale, acc);
                    }
                    if F::FORMAT.has_min() {
                        acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(*asum[c].add(b)), acc);
                    }
                    at.write_volatile(acc);
                });
            }
            wb = wb.add(WIDE_PER_BLOCK);
        }
    }
}

// -------------------------------------------------------------------------------------------------------------
// Float panels (F32, F16) against f32 activations. A block's column k holds the panel's 16 weights of input k, two
// registers of 8 rows: a tile broadcasts each activation once and runs two fused multiply-adds per output row, with
// one accumulator chain per output element as `panel_ref_f` states.

/// Eight weights of one column half from a float panel, as f32.
trait FloatW {
    /// Bytes per weight.
    const SIZE: usize;
    /// Whether a decode tile prefetches each panel's column stream [`DECODE_AHEAD_F`] bytes ahead into L1 (see
    /// [`run_f`]).
    const PREFETCH: bool;
    /// # Safety
    /// `8 · SIZE` bytes must be readable at `p`, `8 · SIZE`-aligned; the CPU must have AVX2 and F16C.
    unsafe fn load8(p: *const u8) -> __m256;
    /// [`full_tile_f`]'s loop: `steps` × [`STEP_F`] columns of a panel from `w` against [`TILE_F`] activation rows
    /// (row `c` at `x0 + c·stride` bytes for c < 3, at `x3 + (c − 3)·stride` after), into `acc` (row `c`'s halves
    /// at `2c`, `2c + 1`); prefetches the line at `pf.0` into L2 each step, then moves it on by `pf.1` bytes. Returns
    /// `w`, `x0`, `x3` and `pf` moved past the steps.
    ///
    /// # Safety
    /// The steps' columns must be readable at `w` (aligned as [`FloatW::load8`] needs) and `4·STEP_F·steps`
    /// bytes at each row; the CPU must have AVX2, FMA and F16C.
    unsafe fn tile_steps(
        w: *const u8,
        x: [*const u8; 2],
        stride: usize,
        steps: usize,
        pf: (*const u8, usize),
        acc: &mut [__m256; 2 * TILE_F],
    ) -> (*const u8, [*const u8; 2], *const u8);
}

/// [`FloatW::tile_steps`] for one weight type: its load instruction (`vmovaps` of a ymmword for f32, `vcvtph2ps`
/// of an xmmword for f16), the bytes of a step's weights (`$step`), and the byte offsets of each column's two halves
/// (`$h0`, `$h1`) and of its activation (`$xd`). In assembly so that the register allocation is ours: 12
/// accumulators, two weights and a broadcast take 15 of the 16 registers, and the six rows are three registers (two
/// bases and a stride). Unrolled in Rust, LLVM kept accumulators on the stack (a store and a load in every chain, F32
/// pp512 1-thread 313 → 220 t/s); the one-column loop it compiled spent 8 integer instructions per 12 multiply-adds
/// on addresses.
macro_rules! float_tile_steps {
    ($ld:literal, $step:literal, $(($h0:literal, $h1:literal, $xd:literal))*) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn tile_steps(
            mut w: *const u8,
            mut x: [*const u8; 2],
            stride: usize,
            steps: usize,
            mut pf: (*const u8, usize),
            acc: &mut [__m256; 2 * TILE_F],
        ) -> (*const u8, [*const u8; 2], *const u8) {
            // SAFETY: the caller's contract; every read is one of those named there (prefetches cannot fault).
            unsafe {
                std::arch::asm!(
                    "2:",
                    "prefetcht1 byte ptr [{pf}]",
                    "add {pf}, {pfs}",
                    $(
                        concat!($ld, " {k0}, [{w} + ", $h0, "]"),
                        concat!($ld, " {k1}, [{w} + ", $h1, "]"),
                        concat!("vbroadcastss {b}, dword ptr [{x0} + ", $xd, "]"),
                        "vfmadd231ps {a0}, {k0}, {b}",
                        "vfmadd231ps {a1}, {k1}, {b}",
                        concat!("vbroadcastss {b}, dword ptr [{x0} + {s} + ", $xd, "]"),
                        "vfmadd231ps {a2}, {k0}, {b}",
                        "vfmadd231ps {a3}, {k1}, {b}",
                        concat!("vbroadcastss {b}, dword ptr [{x0} + 2*{s} + ", $xd, "]"),
                        "vfmadd231ps {a4}, {k0}, {b}",
                        "vfmadd231ps {a5}, {k1}, {b}",
                        concat!("vbroadcastss {b}, dword ptr [{x3} + ", $xd, "]"),
                        "vfmadd231ps {a6}, {k0}, {b}",
                        "vfmadd231ps {a7}, {k1}, {b}",
                        concat!("vbroadcastss {b}, dword ptr [{x3} + {s} + ", $xd, "]"),
                        "vfmadd231ps {a8}, {k0}, {b}",
                        "vfmadd231ps {a9}, {k1}, {b}",
                        concat!("vbroadcastss {b}, dword ptr [{x3} + 2*{s} + ", $xd, "]"),
                        "vfmadd231ps {a10}, {k0}, {b}",
                        "vfmadd231ps {a11}, {k1}, {b}",
                    )*
                    concat!("add {w}, ", $step),
                    "add {x0}, 16",
                    "add {x3}, 16",
                    "dec {n}",
                    "jnz 2b",
                    w = inout(reg) w,
                    x0 = inout(reg) x[0],
                    x3 = inout(reg) x[1],
                    s = in(reg) stride,
                    n = inout(reg) steps => _,
                    pf = inout(reg) pf.0,
                    pfs = in(reg) pf.1,
                    a0 = inout(ymm_reg) acc[0],
                    a1 = inout(ymm_reg) acc[1],
                    a2 = inout(ymm_reg) acc[2],
                    a3 = inout(ymm_reg) acc[3],
                    a4 = inout(ymm_reg) acc[4],
                    a5 = inout(ymm_reg) acc[5],
                    a6 = inout(ymm_reg) acc[6],
                    a7 = inout(ymm_reg) acc[7],
                    a8 = inout(ymm_reg) acc[8],
                    a9 = inout(ymm_reg) acc[9],
                    a10 = inout(ymm_reg) acc[10],
                    a11 = inout(ymm_reg) acc[11],
                    k0 = out(ymm_reg) _,
                    k1 = out(ymm_reg) _,
                    b = out(ymm_reg) _,
                    options(nostack, readonly),
                );
            }
            (w, x, pf.0)
        }
    };
}

impl FloatW for f32 {
    const SIZE: usize = 4;
    const PREFETCH: bool = false;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_load_ps(p.cast()) }
    }
    float_tile_steps!("vmovaps", 256, (0, 32, 0)(64, 96, 4)(128, 160, 8)(192, 224, 12));
}

impl FloatW for half::f16 {
    const SIZE: usize = 2;
    const PREFETCH: bool = true;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_load_si128(p.cast())) }
    }
    float_tile_steps!("vcvtph2ps", 128, (0, 16, 0)(32, 48, 4)(64, 80, 8)(96, 112, 12));
}

/// Rows of activations a float tile multiplies at once: 12 accumulators, two weight registers and a broadcast.
const TILE_F: usize = 6;
/// Panels a decode tile streams at once: eight independent accumulator chains keep the fused multiply-adds busy.
pub(crate) const DECODE_F: usize = 4;
/// Activation rows whose values stay in L2 while all of a task's panels pass.
const CHUNK_F: usize = 48;

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn panel_f(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    check_args_f(&w, &panels, x, n_act);
    // SAFETY (both): the arguments were checked above and the caller has the features.
    unsafe {
        match w.format {
            PackedFormat::F32 => run_f::<f32>(&w, panels, x, n_act, out),
            _ => run_f::<half::f16>(&w, panels, x, n_act, out),
        }
    }
}

/// # Safety
/// As [`panel_f`], with its arguments checked by [`check_args_f`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_f<T: FloatW>(w: &PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    // SAFETY (all tiles): the panels lie in the checked range and the rows o..o + C exist.
    unsafe {
        if n_act == 1 {
            let l2 = small_l1d();
            let mut p = panels.start;
            while p < panels.end {
                // F16 decode tiles wait on memory with the hardware prefetcher alone: perf put most of the tile's
                // cpu-clock samples on the instruction after each panel's first load. Each tile's column streams
                // are prefetched [`DECODE_AHEAD_F`] ahead into L1, or [`DECODE_AHEAD_F_L2`] into L2 where L1 is
                // small (see there); F32 got slower with software prefetches (fetching the next tile into L2, 1
                // thread: 57 → 46-48 tokens per CPU-second in every round), so it does without.
                match panels.end - p {
                    1 => decode_tile_f::<T, 1>(w, p, x, l2, out),
                    2 => decode_tile_f::<T, 2>(w, p, x, l2, out),
                    3 => decode_tile_f::<T, 3>(w, p, x, l2, out),
                    _ => decode_tile_f::<T, DECODE_F>(w, p, x, l2, out),
                }
                p += (panels.end - p).min(DECODE_F);
            }
            return;
        }
        let lines = w.panel_bytes / 64;
        let mut o0 = 0;
        while o0 < n_act {
            let o1 = (o0 + CHUNK_F).min(n_act);
            let tiles = (o1 - o0).div_ceil(TILE_F);
            for p in panels.clone() {
                // The panel the task reads next, this chunk's or (after the last) the next chunk's first: each
                // tile over this one fetches its share of it into L2 (see `full_tile_f`).
                let next = if p + 1 < panels.end { Some(p + 1) } else { (o1 < n_act).then_some(panels.start) };
                let mut o = o0;
                let mut t = 0;
                while o < o1 {
                    match o1 - o {
                        1 => tile_f::<T, 1, 1>(w, p, x, o, out),
                        2 => tile_f::<T, 2, 1>(w, p, x, o, out),
                        3 => tile_f::<T, 3, 1>(w, p, x, o, out),
                        4 => tile_f::<T, 4, 1>(w, p, x, o, out),
                        5 => tile_f::<T, 5, 1>(w, p, x, o, out),
                        _ => {
                            let share = next.map_or((std::ptr::null(), 0), |np| {
                                let (a, b) = (t * lines / tiles, (t + 1) * lines / tiles);
                                (w.bytes.as_ptr().add(np * w.panel_bytes + 64 * a), b - a)
                            });
                            full_tile_f::<T>(w, p, x, o, out, share)
                        }
                    }
                    o += (o1 - o).min(TILE_F);
                    t += 1;
                }
            }
            o0 = o1;
        }
    }
}

/// How far ahead of its reads (in bytes) a decode tile prefetches each F16 panel's column stream into L1: one line
/// per line read, so 4 KB ahead over the tile's four streams. It replaced fetching the whole next tile of panels
/// into L2 spread over the current tile (192 KB for SmolLM2's FFN-down), which on a 2-core Zen 3 (32 KB L1D, 512 KB
/// L2) ran slower than no software prefetch at all.
/// SmolLM2 F16 tg128 -t 2, tokens per CPU-second, interleaved rounds on a host loaded 4.5-6 by other benchmarks:
/// next tile into L2 (before) 61.9 / 76.5 / 72.5 and 81.0 / 73.9 / 60.3; none 73.8 / 86.7 / 90.2; 2 KB ahead into
/// L1 59.4 / 83.1 / 82.9; 1.5 KB 66.7 / 87.5 / 83.6; 1 KB 90.9 / 95.4 / 93.9 and 93.3 / 88.5 / 78.4; 512 B 97.4 /
/// 82.4 / 95.3; 1 KB into L2 96.8 / 85.6 / 90.7. (The AVX-512 kernel's Zen 5 choice is 2 KB; its 1 KB lost there.)
/// Where L1D is 32 KB or less, the streams now go [`DECODE_AHEAD_F_L2`] ahead into L2 instead (see there).
const DECODE_AHEAD_F: usize = 1024;

/// How far ahead each F16 column stream of a decode tile is prefetched into L2, rather than into L1, where L1D is
/// 32 KB or less ([`small_l1d`]): both panel kernels use it there.
/// - AVX-512 on Zen 4 (32 KB L1D, 1 MB L2), SmolLM2's 30 layers of F16 panels in the kernel bench, tokens per
///   CPU-second on one thread / per wall second on two, medians of 5 interleaved rounds: 2 KB into L1 77 / 113,
///   into L2 87 / 132; 4 KB into L2 92 / 139; 8 KB 89 / 126; none 83 / 117; a second run, 2 KB into L1 65 / 112
///   against 4 KB into L2 76 / 115.
/// - AVX2 forced on the same Zen 4, SmolLM2 F16 `bench -n 128 -t 2`, 9 interleaved rounds (after
///   [`decode_tile_f`] stopped spilling): 1 KB into L1 (before) median 108.7 t/s (95.6-122.7); none 125.4
///   (103.4-153.6); 2 KB into L2 132.3 (107.3-150.1); 4 KB into L2 130.7 (110.7-149.2); each L2 variant beat
///   the L1 one in every round. The AVX2-only Zen 3 above (32 KB L1D, 512 KB L2) has measured only 1 KB into L2,
///   level with 1 KB into L1.
pub(crate) const DECODE_AHEAD_F_L2: usize = 4 * 1024;

/// Columns per step of [`FloatW::tile_steps`]'s loop (`cols`, a multiple of 32, is a whole number of steps).
const STEP_F: usize = 4;

/// Panel `p` against the [`TILE_F`] activation rows `o..`, in [`FloatW::tile_steps`]'s assembly, fetching the
/// `pf.1` lines at `pf.0` into L2 on the way (one a step, then none).
///
/// Those lines are this tile's share of the panel the task reads next. Without them, the first tile over each panel
/// waited on memory: it reads the panel at a 6-row tile's pace (64 bytes per 12 multiply-adds, ~30 GB/s on one
/// core of the Xeon), which one core's share of DRAM cannot feed, and a task's panels (F32, or any format where the
/// L3 is small) are past L2 and L3 by the time the next chunk of rows comes round to them. Spread over all the
/// tiles of a panel, the next one arrives at an eighth of that pace.
///
/// # Safety
/// As [`tile_f`] with `C` = [`TILE_F`] and `P` = 1; `pf` is only a hint (it may point anywhere).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn full_tile_f<T: FloatW>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    o: usize,
    out: &OutSink<'_>,
    pf: (*const u8, usize),
) {
    let cols = w.nb * 32;
    let steps = cols / STEP_F;
    let stride = cols * 4;
    // SAFETY: the panel's columns and rows o..o + TILE_F of `x` (the caller's contract) are what the steps read;
    // the epilogue writes rows o..o + TILE_F of the panel's outputs, which the sink checks.
    unsafe {
        let base = w.bytes.as_ptr().add(p * w.panel_bytes);
        let x0 = x.as_ptr().add(o * cols).cast::<u8>();
        let mut acc = [_mm256_setzero_ps(); 2 * TILE_F];
        let lead = pf.1.min(steps);
        let (mut wp, mut xs) = (base, [x0, x0.add(3 * stride)]);
        if lead > 0 {
            (wp, xs, _) = T::tile_steps(wp, xs, stride, lead, (pf.0, 64), &mut acc);
        }
        if steps > lead {
            // The rest without a prefetch: the hint stays on the panel's first line, already in L1.
            T::tile_steps(wp, xs, stride, steps - lead, (base, 0), &mut acc);
        }
        for c in 0..TILE_F {
            let mut lanes = [0f32; PANEL_ROWS];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[2 * c]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(HALF), acc[2 * c + 1]);
            out.put_row(o + c, p * PANEL_ROWS, &lanes);
        }
    }
}

/// Panels `p..p + P` against activation rows `o..o + C`.
///
/// # Safety
/// As [`run_f`], with `p + P` ≤ `w.n_panels` and rows `o..o + C` in `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_f<T: FloatW, const C: usize, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    o: usize,
    out: &OutSink<'_>,
) {
    const { assert!(C >= 1 && C <= TILE_F && P >= 1 && P <= DECODE_F) };
    let cols = w.nb * 32;
    let column = PANEL_ROWS * T::SIZE;
    // SAFETY: the pointers stay inside panels p..p + P (nb blocks of 32 columns, `panel_bytes` each, checked) and
    // inside rows o..o + C of `x`, which the caller guarantees; every column starts on a multiple of its size.
    unsafe {
        let base: [*const u8; P] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        let xr: [*const f32; C] = std::array::from_fn(|c| x.as_ptr().add((o + c) * cols));
        let mut acc = [[[_mm256_setzero_ps(); 2]; P]; C];
        for k in 0..cols {
            let wv: [[__m256; 2]; P] = std::array::from_fn(|i| {
                let col = base[i].add(k * column);
                [T::load8(col), T::load8(col.add(8 * T::SIZE))]
            });
            for_each_c!(C, c, {
                let xb = _mm256_broadcast_ss(&*xr[c].add(k));
                for i in 0..P {
                    acc[c][i][0] = _mm256_fmadd_ps(wv[i][0], xb, acc[c][i][0]);
                    acc[c][i][1] = _mm256_fmadd_ps(wv[i][1], xb, acc[c][i][1]);
                }
            });
        }
        for (c, row) in acc.iter().enumerate() {
            for (i, halves) in row.iter().enumerate() {
                let mut lanes = [0f32; PANEL_ROWS];
                _mm256_storeu_ps(lanes.as_mut_ptr(), halves[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(HALF), halves[1]);
                out.put_row(o + c, (p + i) * PANEL_ROWS, &lanes);
            }
        }
    }
}

/// Panels `p..p + P` against the one activation row `x`, prefetching their column streams on the way
/// (`T::PREFETCH`): [`DECODE_AHEAD_F`] ahead into L1, or with `l2` [`DECODE_AHEAD_F_L2`] ahead into L2.
///
/// Each weight register goes into its product as soon as it is loaded, so that the 2·P accumulators, a weight and
/// the broadcast fit in 16 registers, and the loop steps a cache line at a time, so that the prefetch needs no
/// test per column. [`tile_f`]'s shape (all 2·P weights loaded first, a prefetch test per column) made the
/// compiler keep one accumulator on the stack, its chain running through a store and a load every column.
/// Forced AVX2 on Zen 4, kernel bench, one thread, per CPU-second: F16 panels that stay in L2 ran at 30-32 GB/s,
/// 62-89 in this shape with the same prefetch into L1 (45-52 with the L2 prefetch Zen 4 now takes, see
/// [`DECODE_AHEAD_F_L2`]); SmolLM2's 49152×576 F16 head, from memory, 19-22 → 22-29 GB/s.
///
/// # Safety
/// As [`run_f`], with `p + P` ≤ `w.n_panels` and `x` one row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_tile_f<T: FloatW, const P: usize>(
    w: &PackedView<'_>,
    p: usize,
    x: &[f32],
    l2: bool,
    out: &OutSink<'_>,
) {
    const { assert!(P >= 1 && P <= DECODE_F) };
    let cols = w.nb * 32;
    let column = PANEL_ROWS * T::SIZE;
    // Columns per cache line (2 for f16, 1 for f32): `cols`, a multiple of 32, is a whole number of lines.
    let per_line = 64 / column;
    // SAFETY: the pointers stay inside panels p..p + P (nb blocks of 32 columns, `panel_bytes` each, checked) and
    // inside x's `cols` values; every column starts on a multiple of its size.
    unsafe {
        let base: [*const u8; P] = std::array::from_fn(|i| w.bytes.as_ptr().add((p + i) * w.panel_bytes));
        let mut acc = [[_mm256_setzero_ps(); 2]; P];
        for line in 0..cols / per_line {
            if T::PREFETCH {
                prefetch_streams(base, line * 64, l2, DECODE_AHEAD_F);
            }
            for k in line * per_line..(line + 1) * per_line {
                let xb = _mm256_broadcast_ss(&*x.as_ptr().add(k));
                for i in 0..P {
                    let col = base[i].add(k * column);
                    acc[i][0] = _mm256_fmadd_ps(T::load8(col), xb, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(T::load8(col.add(8 * T::SIZE)), xb, acc[i][1]);
                }
            }
        }
        for (i, halves) in acc.iter().enumerate() {
            let mut lanes = [0f32; PANEL_ROWS];
            _mm256_storeu_ps(lanes.as_mut_ptr(), halves[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(HALF), halves[1]);
            out.put_row(0, (p + i) * PANEL_ROWS, &lanes);
        }
    }
}
