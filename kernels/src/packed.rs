//! Weights repacked at load time into 16-row interleaved panels, for the wide integer kernels.
//!
//! In GGUF a weight row's blocks lie one after another, so a SIMD kernel working row by row must reduce each dot
//! product across its lanes and pay a float epilogue (convert, scale, add) per row, block and activation row. At
//! batch sizes above one that epilogue, not the multiply-adds, is the cost. A panel turns the problem around: the
//! four-byte groups of 16 consecutive rows are interleaved, so one 512-bit `vpdpbusd` with a broadcast group of
//! four activation bytes advances all 16 rows at once, lane `r` belonging to row `r`. Nothing is reduced across
//! lanes, each block's epilogue serves 16 rows, and the 16 results of a panel are contiguous in the output.
//!
//! Layout of one panel (16 rows × `nb` 32-weight blocks), 64-byte aligned: a sequence of groups of blocks, each
//! group its blocks' quants, then those blocks' scales, a whole number of 64-byte lines, so that a panel is read
//! front to back as one stream ([`Sections`] computes every offset).
//!
//! ```text
//! group  its blocks' quants, QS bytes each, then their scales (below), then padding to a whole line
//! qs     block b: QS/64 chunks of 64 bytes; chunk j holds, for rows r = 0..16, a 4-byte group of row r at bytes
//!        4r..4r+4
//! ```
//!
//! With the scales in a section of their own after all the quants (as this layout was before), a panel was three
//! or four interleaved read streams, which the hardware prefetcher does not follow: decode reached ~59% of the read
//! rate on Q4_1, against ~90% for the F32 panels, which have no scales. A C model of the same bytes read 15.3 GB/s
//! on 2 threads with the separate sections and software prefetch, 23.3 GB/s as one stream without.
//!
//! Quants, by format (`u` is the unsigned quant the kernels multiply):
//! - [`PackedFormat::Q4`] (from Q4_0 and Q4_1) and [`PackedFormat::K4`] (from Q4_K): chunk `j` (0..4) holds the
//!   nibble bytes `4j..4j+4` of each row, so its low nibbles are weights `4j..4j+4` and its high nibbles weights
//!   `16+4j..16+4j+4`, exactly as in a Q4_0 block (Q4_K's nibbles are re-paired to match).
//! - [`PackedFormat::Q5`] (from Q5_0): the Q4 chunks, then a fifth 64-byte chunk holding each row's 32 high bits
//!   (the GGUF `qh`, bit k for weight k) at bytes 4r..4r+4.
//! - [`PackedFormat::Q8`] (from Q8_0): chunk `j` (0..8) holds weights `4j..4j+4` of each row, biased by +128 so
//!   they are unsigned (`vpdpbusd` multiplies unsigned by signed bytes).
//! - [`PackedFormat::K6`] (from Q6_K, `u` in 0..=63): the Q4 chunks of the low four bits, then two chunks of high
//!   bit pairs: byte `i` of row `r` in chunk `4 + h` holds, from its low bits up, the top two bits of weights
//!   `4j+i` and `16+4j+i` for `j = 2h`, then the same for `j = 2h + 1`.
//! - [`PackedFormat::F32`] and [`PackedFormat::F16`] (unquantized weights, dotted with f32 activations): block `b`
//!   holds its 32 columns one after another, each as the 16 rows' values, so that one weight column of a panel
//!   is one or two registers and a broadcast activation multiplies it without any reduction across lanes.
//!
//! Groups and their scales (each line of 16 holds the rows in order):
//!
//! ```text
//!          blocks  scales after the quants                          bytes
//! Q4       1       d: 16 f16, m: 16 f16                             256 + 64 = 320
//! Q5       1       d: 16 f16, m: 16 f16                             320 + 64 = 384
//! Q8       2       d: 16 f16 per block                              2·512 + 2·32 = 1088
//! K4       8       d, dmin: 16 f16 each, sc: 8 × 16 u8, mn: 8 × 16 u8   8·256 + 64 + 256 = 2368
//! K6       8       d: 16 f16, sc: 8 × 2 × 16 i8 (per block, the first   8·384 + 32 + 256 = 3360, padded to 3392
//!                  16 weights' line, then the last 16's)
//! F32, F16 1       none                                             QS
//! ```
//!
//! A partial last group (Q8 with an odd `nb`) takes a whole group's bytes. The weights are:
//!
//! ```text
//! Q4, Q5   weight = d·u + m (Q4_0's m is −8·d, Q5_0's −16·d)
//! Q8       weight = d·(u − 128)
//! K4       weight = (d·sc)·u − dmin·mn (sc, mn of the 32-weight block)
//! K6       weight = (d·sc)·(u − 32)
//! ```
//!
//! Packing keeps every bit of the source: the panels hold the same quants and the same scales, only moved (and
//! Q4_0/Q5_0's offsets spelled out, which is exact in f16 unless it overflows). Every format is a sequence of
//! 32-weight blocks with a scale per block (per half block for K6) and an optional offset, so one tile loop serves
//! all of them; a K format's scale `d·sc` is formed in f32 when it is used (exact: 11 × 8 significant bits). The
//! activations are the [`Act32`] blocks for every format. The scalar [`panel_ref`] states exactly what the SIMD
//! kernels compute, in the same order of float operations, so they agree bit for bit.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use half::f16;

use rayon::prelude::*;

use crate::GgmlType;
use crate::arch::{q4k_scales_mins, unpack_q6_k};
use crate::dispatch::{Act32, OutSink};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, cast_blocks};

/// Rows per panel: one i32 lane each in a 512-bit register (two halves of 8 in 256-bit ones).
pub const PANEL_ROWS: usize = 16;

/// 32-weight blocks per K-quant super-block.
const SUPER: usize = 8;

/// How a panel's quants and scales are stored (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackedFormat {
    /// Unsigned nibbles with a scale and an offset per row and block (Q4_0, Q4_1).
    Q4,
    /// Nibbles plus a plane of high bits, with a scale and an offset (Q5_0).
    Q5,
    /// Bytes biased to unsigned, with a scale per row and block (Q8_0).
    Q8,
    /// Q4_K: nibbles, with 6-bit scales and mins per block under f16 super-block scales.
    K4,
    /// Q6_K: 6-bit quants (nibbles plus bit pairs), with an 8-bit scale per half block under an f16 super-block
    /// scale.
    K6,
    /// F32 weights, column by column.
    F32,
    /// F16 weights, column by column.
    F16,
}

impl PackedFormat {
    /// Every format, for tests and tables.
    pub const ALL: [PackedFormat; 7] = [
        PackedFormat::Q4,
        PackedFormat::Q5,
        PackedFormat::Q8,
        PackedFormat::K4,
        PackedFormat::K6,
        PackedFormat::F32,
        PackedFormat::F16,
    ];

    /// Quant bytes per block of a whole panel.
    pub const fn qs_bytes(self) -> usize {
        match self {
            PackedFormat::Q4 | PackedFormat::K4 => PANEL_ROWS * 16,
            PackedFormat::Q5 => PANEL_ROWS * 20,
            PackedFormat::K6 => PANEL_ROWS * 24,
            PackedFormat::Q8 => PANEL_ROWS * 32,
            PackedFormat::F32 => PANEL_ROWS * 32 * 4,
            PackedFormat::F16 => PANEL_ROWS * 32 * 2,
        }
    }

    /// Whether the weights carry an offset `m` per row and block (a float term `m·s` per activation block).
    pub const fn has_min(self) -> bool {
        matches!(self, PackedFormat::Q4 | PackedFormat::Q5 | PackedFormat::K4)
    }

    /// The bias the integer dot product takes back out, times the activations' Σq.
    pub const fn offset(self) -> i32 {
        match self {
            PackedFormat::Q8 => 128,
            PackedFormat::K6 => 32,
            _ => 0,
        }
    }

    /// Whether each half block (16 weights) has a scale of its own, so that the two halves' integer sums are
    /// scaled separately.
    pub const fn split_halves(self) -> bool {
        matches!(self, PackedFormat::K6)
    }

    /// Whether the scales are K-quant style: an f16 super-block scale times a small integer per block.
    pub const fn is_k(self) -> bool {
        matches!(self, PackedFormat::K4 | PackedFormat::K6)
    }

    /// Whether the weights are unquantized values, dotted with f32 activations rather than [`Act32`] blocks.
    pub const fn is_float(self) -> bool {
        matches!(self, PackedFormat::F32 | PackedFormat::F16)
    }

    /// The packed format for GGUF type `ty`, if there is one.
    pub fn for_type(ty: GgmlType) -> Option<PackedFormat> {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => Some(PackedFormat::Q4),
            GgmlType::Q5_0 => Some(PackedFormat::Q5),
            GgmlType::Q8_0 => Some(PackedFormat::Q8),
            GgmlType::Q4_K => Some(PackedFormat::K4),
            GgmlType::Q6_K => Some(PackedFormat::K6),
            GgmlType::F32 => Some(PackedFormat::F32),
            GgmlType::F16 => Some(PackedFormat::F16),
            _ => None,
        }
    }
}

/// Where everything of a panel lies, as byte offsets from the panel's start: the one place that knows the layout
/// (see the module documentation). A panel is a sequence of groups of [`Sections::group_blocks`] blocks, each its
/// blocks' quants followed by their scales. The sizes are kept here so that an offset is a shift, a mask and two
/// multiplications, without a division (packing asks for several per row and block); the kernels make theirs from
/// their format constant, where every size folds to a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sections {
    format: PackedFormat,
    /// Groups per panel (a partial last group takes a whole group's bytes).
    groups: usize,
    /// log2 of [`Sections::group_blocks`].
    shift: u32,
    /// [`Sections::group_bytes`], and the quant bytes per block.
    group_bytes: usize,
    qs_bytes: usize,
}

impl Sections {
    pub const fn of(format: PackedFormat, nb: usize) -> Sections {
        let blocks = Self::group_blocks(format);
        Sections {
            format,
            groups: nb.div_ceil(blocks),
            shift: blocks.trailing_zeros(),
            group_bytes: (blocks * format.qs_bytes() + Self::scale_bytes(format)).next_multiple_of(64),
            qs_bytes: format.qs_bytes(),
        }
    }

    /// Blocks per group (a power of two): as many as make quants plus scales a whole number of 64-byte lines (Q8:
    /// 2 × 544 bytes), or a K super-block, whose scales come together.
    pub const fn group_blocks(format: PackedFormat) -> usize {
        match format {
            PackedFormat::Q8 => 2,
            PackedFormat::K4 | PackedFormat::K6 => SUPER,
            _ => 1,
        }
    }

    /// Bytes of one group's scales (before padding).
    const fn scale_bytes(format: PackedFormat) -> usize {
        let line16 = PANEL_ROWS * 2; // one f16 per row
        match format {
            // d, m
            PackedFormat::Q4 | PackedFormat::Q5 => 2 * line16,
            // d of each block
            PackedFormat::Q8 => 2 * line16,
            // d, dmin, then 8 lines of sc and 8 of mn
            PackedFormat::K4 => 2 * line16 + 2 * SUPER * PANEL_ROWS,
            // d, then 8 blocks × 2 halves' lines of sc
            PackedFormat::K6 => line16 + 2 * SUPER * PANEL_ROWS,
            PackedFormat::F32 | PackedFormat::F16 => 0,
        }
    }

    /// Bytes per group: quants, then scales, padded to whole lines (only K6's 3360 needs padding, to 3392).
    #[inline(always)]
    pub const fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// Block `b`'s group.
    #[inline(always)]
    const fn group(&self, b: usize) -> usize {
        (b >> self.shift) * self.group_bytes
    }

    /// Block `b`'s group's scales.
    #[inline(always)]
    const fn scales(&self, b: usize) -> usize {
        self.group(b) + (self.qs_bytes << self.shift)
    }

    /// Block `b`'s quants: `qs_bytes()` bytes, 64-byte aligned.
    #[inline(always)]
    pub const fn qs(&self, b: usize) -> usize {
        self.group(b) + (b & ((1 << self.shift) - 1)) * self.qs_bytes
    }

    /// The line of 16 f16 `d` that scales block `b` (the K formats: its super-block's).
    #[inline(always)]
    pub const fn d(&self, b: usize) -> usize {
        match self.format {
            PackedFormat::Q8 => self.scales(b) + b % 2 * PANEL_ROWS * 2,
            _ => self.scales(b),
        }
    }

    /// The line of 16 f16 `m` (Q4, Q5) or `dmin` (K4, its super-block's) of block `b`; right after `d`.
    #[inline(always)]
    pub const fn m(&self, b: usize) -> usize {
        self.scales(b) + PANEL_ROWS * 2
    }

    /// The K formats: block `b`'s line of 16 integer scales (K6: two lines, the first 16 weights' then the last's).
    #[inline(always)]
    pub const fn sc(&self, b: usize) -> usize {
        match self.format {
            PackedFormat::K6 => self.scales(b) + PANEL_ROWS * 2 + b % SUPER * 2 * PANEL_ROWS,
            _ => self.scales(b) + 2 * PANEL_ROWS * 2 + b % SUPER * PANEL_ROWS,
        }
    }

    /// K4: block `b`'s line of 16 integer mins, after the group's 8 lines of scales.
    #[inline(always)]
    pub const fn mn(&self, b: usize) -> usize {
        self.scales(b) + 2 * PANEL_ROWS * 2 + (SUPER + b % SUPER) * PANEL_ROWS
    }

    /// Bytes of a panel (a multiple of 64).
    pub const fn end(&self) -> usize {
        self.groups * self.group_bytes
    }
}

/// One cache line, so a buffer of lines is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// A weight matrix in panels (made once at load by [`pack`] or, sharing one buffer with others, [`pack_all`]).
pub struct PackedMatrix {
    source: GgmlType,
    format: PackedFormat,
    rows: usize,
    cols: usize,
    panel_bytes: usize,
    /// The buffer holding the panels (perhaps with other matrices'), and this matrix's lines in it.
    storage: Arc<Lines>,
    lines: Range<usize>,
}

impl fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("source", &self.source)
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// A borrowed view of a [`PackedMatrix`], what the kernels take.
#[derive(Clone, Copy, Debug)]
pub struct PackedView<'a> {
    pub format: PackedFormat,
    /// Blocks per row.
    pub nb: usize,
    pub n_panels: usize,
    /// Bytes per panel (a multiple of 64).
    pub panel_bytes: usize,
    /// All panels, 64-byte aligned.
    pub bytes: &'a [u8],
}

fn panel_bytes(format: PackedFormat, nb: usize) -> usize {
    Sections::of(format, nb).end()
}

/// Repacks `rows × cols` weights of type `ty` (GGUF bytes `data`) into panels. `None` when there is no packed
/// form: another type, rows not a multiple of [`PANEL_ROWS`], a size that does not match, or a Q4_0/Q5_0 scale so
/// large that its offset `-8·d` (`-16·d`) would overflow f16. The caller then keeps the GGUF layout and its kernels.
pub fn pack(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Option<PackedMatrix> {
    pack_then(ty, data, rows, cols, |_| {})
}

/// One matrix for [`pack_all`]: `rows × cols` weights of type `ty`, GGUF bytes `data`.
#[derive(Clone, Copy, Debug)]
pub struct PackJob<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// How one matrix is packed: checked against its type and size once, before anything is allocated.
#[derive(Clone, Copy)]
struct Plan {
    format: PackedFormat,
    sections: Sections,
    /// Bytes per panel and per source row.
    pb: usize,
    row_bytes: usize,
    /// Panels per task (each task's source is about [`PACK_CHUNK`] bytes).
    per_task: usize,
}

impl Plan {
    fn of(job: &PackJob<'_>) -> Option<Plan> {
        let PackJob { ty, data, rows, cols } = *job;
        let format = PackedFormat::for_type(ty)?;
        // Whole 32-column blocks, and the K-quants' whole super-blocks.
        if rows == 0 || !rows.is_multiple_of(PANEL_ROWS) || cols == 0 || !cols.is_multiple_of(ty.block_size().max(32)) {
            return None;
        }
        if rows.checked_mul(cols / ty.block_size())?.checked_mul(ty.type_size())? != data.len() {
            return None;
        }
        let nb = cols / 32;
        let row_bytes = data.len() / rows;
        let per_task = (PACK_CHUNK / (PANEL_ROWS * row_bytes)).max(1);
        Some(Plan { format, sections: Sections::of(format, nb), pb: panel_bytes(format, nb), row_bytes, per_task })
    }

    fn n_lines(&self, rows: usize) -> usize {
        rows / PANEL_ROWS * self.pb / 64
    }
}

/// Source bytes packed per task of [`pack_then`]: each chunk's source can be let go while the others are packed.
const PACK_CHUNK: usize = 1 << 20;

/// [`pack`], calling `done` with each byte range of `data` once its panels are written (in no particular order,
/// from the packing threads), so that a caller can drop the source pages (of a memory map) as it goes instead of
/// holding the whole source and the whole packed copy at once.
pub fn pack_then(
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    done: impl Fn(Range<usize>) + Sync,
) -> Option<PackedMatrix> {
    pack_all(&[PackJob { ty, data, rows, cols }], |_, r| done(r)).pop().flatten()
}

/// Packs every matrix of `jobs` (as [`pack_then`], each result `None` where that matrix has no packed form) into
/// one buffer they share, calling `done(job, range)` with each byte range of a job's `data` once its panels are
/// written. The threads share out every matrix's tasks together, so many small matrices keep both busy as well as
/// one large one does.
///
/// One buffer rather than one per matrix, because filling fresh memory costs more than packing into it: every 4 KB
/// page written the first time is a page fault and a page cleared by the kernel, and Gemma 3's 239 MB of panels
/// took ~61k of them (perf: half of a launch's samples were in the kernel). One large buffer is a mapping the
/// kernel fills with 2 MB pages, 512 times fewer faults, whatever the matrices' sizes (Gemma 3's layer matrices
/// are 0.1 to 1.1 MB each; see [`Lines`]). A matrix that turns out not to be packable (an offset that overflows
/// f16, checked only while packing) leaves its share of the buffer unused.
pub fn pack_all(jobs: &[PackJob<'_>], done: impl Fn(usize, Range<usize>) + Sync) -> Vec<Option<PackedMatrix>> {
    let plans: Vec<Option<Plan>> = jobs.iter().map(Plan::of).collect();
    let n_lines = |j: usize| plans[j].map_or(0, |p| p.n_lines(jobs[j].rows));
    let mut storage = Lines::zeroed((0..jobs.len()).map(n_lines).sum());
    // Every task of every matrix in one list: (job, first panel, its panels' lines).
    let mut tasks = Vec::new();
    let mut rest: &mut [Line] = &mut storage;
    for (j, plan) in plans.iter().enumerate() {
        let Some(plan) = plan else { continue };
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n_lines(j));
        rest = tail;
        let task_lines = plan.per_task * plan.pb / 64;
        tasks.extend(mine.chunks_mut(task_lines).enumerate().map(|(t, lines)| (j, t * plan.per_task, lines)));
    }
    let failed: Vec<AtomicBool> = jobs.iter().map(|_| AtomicBool::new(false)).collect();
    tasks.into_par_iter().for_each(|(j, first, lines)| {
        // The plan exists: only planned jobs have tasks.
        let Some(plan) = plans[j] else { return };
        let PackJob { ty, data, .. } = jobs[j];
        let panels = lines.len() / (plan.pb / 64);
        let ok = lines.chunks_mut(plan.pb / 64).enumerate().all(|(i, panel)| {
            let bytes = lines_as_bytes_mut(panel);
            (0..PANEL_ROWS).all(|r| {
                let row = (first + i) * PANEL_ROWS + r;
                let src = &data[row * plan.row_bytes..(row + 1) * plan.row_bytes];
                let mut out = RowWriter { r, sections: plan.sections, bytes: &mut *bytes };
                out.write(ty, src).is_some()
            })
        });
        let rows = first * PANEL_ROWS..(first + panels) * PANEL_ROWS;
        done(j, rows.start * plan.row_bytes..rows.end * plan.row_bytes);
        if !ok {
            failed[j].store(true, Ordering::Relaxed);
        }
    });
    let storage = Arc::new(storage);
    let mut at = 0;
    (0..jobs.len())
        .map(|j| {
            let lines = at..at + n_lines(j);
            at = lines.end;
            let plan = plans[j].filter(|_| !failed[j].load(Ordering::Relaxed))?;
            let PackJob { ty, rows, cols, .. } = jobs[j];
            let storage = Arc::clone(&storage);
            Some(PackedMatrix { source: ty, format: plan.format, rows, cols, panel_bytes: plan.pb, storage, lines })
        })
        .collect()
}

/// Zero-filled lines: below [`Lines::MAP_MIN`] bytes a heap buffer, above it (on Linux) an anonymous mapping with
/// transparent huge pages asked for (`MADV_HUGEPAGE`, which the kernel's default `madvise` mode requires). A fresh
/// mapping's pages come zeroed from the kernel, so nothing clears them again, and with 2 MB pages one fault maps
/// what takes 512 with 4 KB ones (240 MB, CPU time: ~12 ms against ~85 ms of faults and ~18 ms more to unmap). The
/// panels are read at every token afterwards, and 2 MB pages also take fewer TLB entries then. Where huge pages are
/// unavailable (or the advice is refused) the mapping simply has 4 KB pages.
///
/// `INFER_HUGEPAGES=0` leaves the advice out. A virtual machine whose free memory is handed back to its host
/// (virtio free page reporting) pays for touching such memory again in the host, and huge pages come from exactly
/// those large free blocks: on the development VM, 240 MB of them took 12 to 425 ms of CPU time to fault in
/// depending on the host's state, against a steady ~100 ms with 4 KB pages.
enum Lines {
    Heap(Vec<Line>),
    #[cfg(target_os = "linux")]
    Mapped(MappedLines),
}

/// Bytes of panel buffers alive in this process (every model loaded): the working set decode streams, which the
/// decode kernels weigh against the last-level cache (`arch::cache::decode_stream`).
static PANEL_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes of packed panels alive in this process, over every [`PackedMatrix`] (matrices packed together share one
/// buffer, counted until the last of them is dropped).
pub fn panel_bytes_alive() -> usize {
    PANEL_BYTES.load(Ordering::Relaxed)
}

impl Lines {
    /// Buffers from this size up are mapped: one 2 MB page.
    const MAP_MIN: usize = 2 << 20;

    fn zeroed(n: usize) -> Lines {
        PANEL_BYTES.fetch_add(n * 64, Ordering::Relaxed);
        #[cfg(target_os = "linux")]
        if n.saturating_mul(64) >= Self::MAP_MIN
            && let Some(m) = MappedLines::zeroed(n)
        {
            return Lines::Mapped(m);
        }
        Lines::Heap(vec![Line([0; 64]); n])
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        PANEL_BYTES.fetch_sub(self.len() * 64, Ordering::Relaxed);
    }
}

impl std::ops::Deref for Lines {
    type Target = [Line];
    fn deref(&self) -> &[Line] {
        match self {
            Lines::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Lines::Mapped(m) => m.as_slice(),
        }
    }
}

impl std::ops::DerefMut for Lines {
    fn deref_mut(&mut self) -> &mut [Line] {
        match self {
            Lines::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Lines::Mapped(m) => m.as_mut_slice(),
        }
    }
}

/// `len` lines in a private anonymous mapping of their own, unmapped on drop.
#[cfg(target_os = "linux")]
struct MappedLines {
    ptr: std::ptr::NonNull<Line>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (like a `Box<[Line]>`): shared references only read it, and
// writing takes `&mut self`.
#[cfg(target_os = "linux")]
unsafe impl Send for MappedLines {}
// SAFETY: as for `Send`.
#[cfg(target_os = "linux")]
unsafe impl Sync for MappedLines {}

#[cfg(target_os = "linux")]
impl MappedLines {
    /// A new mapping of `len` zeroed lines (`None` if the system refuses it: the caller then uses the heap).
    fn zeroed(len: usize) -> Option<MappedLines> {
        let bytes = len.checked_mul(64)?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing (no hint, no MAP_FIXED), so no
        // existing memory is touched; the result is checked before use.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), bytes, prot, flags, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        if want_huge_pages() {
            // SAFETY: advice on the mapping just made, whose pages are untouched: huge pages change how it is
            // backed, never its contents (zero). A refusal (THP disabled) leaves 4 KB pages; the result is ignored.
            unsafe { libc::madvise(ptr, bytes, libc::MADV_HUGEPAGE) };
        }
        // A page-aligned mapping is 64-byte aligned, as `Line` requires.
        Some(MappedLines { ptr: std::ptr::NonNull::new(ptr.cast())?, len })
    }

    fn as_slice(&self) -> &[Line] {
        // SAFETY: `ptr` is a live, readable mapping of `len` lines, zero-filled by the kernel (a valid `Line` is
        // any 64 bytes), aligned; it is unmapped only by `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [Line] {
        // SAFETY: as in `as_slice`, and the mapping is writable; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Whether panel buffers ask for huge pages: unless `INFER_HUGEPAGES=0` (see [`Lines`]).
#[cfg(target_os = "linux")]
fn want_huge_pages() -> bool {
    static WANT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANT.get_or_init(|| std::env::var_os("INFER_HUGEPAGES").is_none_or(|v| v != "0"))
}

#[cfg(target_os = "linux")]
impl Drop for MappedLines {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, with its length; nothing borrows it any more (`&mut self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len * 64) };
    }
}

/// Writes one row of a panel (row `r` of 16) from its GGUF bytes.
struct RowWriter<'a> {
    r: usize,
    sections: Sections,
    bytes: &'a mut [u8],
}

impl RowWriter<'_> {
    /// Decodes `src` (one row of type `ty`) into the panel. `None` if a block cannot be held (an offset that
    /// overflows f16).
    fn write(&mut self, ty: GgmlType, src: &[u8]) -> Option<()> {
        // Scaling by a power of two is exact in f16 unless it overflows; such a block keeps the GGUF layout.
        let offset = |d: f16, by: f32| Some(f16::from_f32(by * d.to_f32())).filter(|m| m.is_finite());
        match ty {
            GgmlType::Q4_0 => {
                for (b, blk) in cast_blocks::<BlockQ4_0>(src)?.iter().enumerate() {
                    self.groups(b, &blk.qs);
                    self.f16s(self.sections.d(b), blk.d);
                    self.f16s(self.sections.m(b), offset(blk.d, -8.0)?);
                }
            }
            GgmlType::Q4_1 => {
                for (b, blk) in cast_blocks::<BlockQ4_1>(src)?.iter().enumerate() {
                    self.groups(b, &blk.qs);
                    self.f16s(self.sections.d(b), blk.d);
                    self.f16s(self.sections.m(b), blk.m);
                }
            }
            GgmlType::Q5_0 => {
                for (b, blk) in cast_blocks::<BlockQ5_0>(src)?.iter().enumerate() {
                    self.groups(b, &blk.qs);
                    let at = self.sections.qs(b) + 256 + 4 * self.r;
                    self.bytes[at..at + 4].copy_from_slice(&blk.qh);
                    self.f16s(self.sections.d(b), blk.d);
                    self.f16s(self.sections.m(b), offset(blk.d, -16.0)?);
                }
            }
            GgmlType::Q8_0 => {
                // Straight from each block's bytes (d, then the 32 quants), sixteen quants at a time in a u128 biased
                // with one xor: a map over the `i8` quants compiled to byte loads, shifts and ors, ~4 instructions
                // a byte, and Q8_0 is most of what a model with a Q8_0 output head packs (Gemma 3: 170 of 235 MB).
                const BLOCK: usize = size_of::<BlockQ8_0>();
                if !src.len().is_multiple_of(BLOCK) {
                    return None;
                }
                for (b, blk) in src.chunks_exact(BLOCK).enumerate() {
                    let (lo, hi) = (u128_at(blk, 2) ^ BIAS8, u128_at(blk, 18) ^ BIAS8);
                    let mut q = [0u8; 32];
                    q[..16].copy_from_slice(&lo.to_le_bytes());
                    q[16..].copy_from_slice(&hi.to_le_bytes());
                    self.groups(b, &q);
                    self.f16s(self.sections.d(b), f16::from_le_bytes([blk[0], blk[1]]));
                }
            }
            GgmlType::Q4_K => {
                for (sb, blk) in cast_blocks::<BlockQ4K>(src)?.iter().enumerate() {
                    // Straight from the GGUF nibbles, without unpacking to 256 bytes first: each 32-byte chunk `c`
                    // of `qs` holds block 2c in its low nibbles and block 2c + 1 in its high ones, and a packed
                    // byte `i` is weight i low, weight i + 16 high.
                    // Sixteen bytes at a time in a u128 (a byte loop here cost ~11 instructions a byte).
                    for (c, q) in blk.qs.chunks_exact(32).enumerate() {
                        let (a, b) = (u128_at(q, 0), u128_at(q, 16));
                        let lo = (a & NIB_LO) | (b & NIB_LO) << 4;
                        let hi = (a >> 4 & NIB_LO) | (b & !NIB_LO);
                        self.groups(sb * SUPER + 2 * c, &lo.to_le_bytes());
                        self.groups(sb * SUPER + 2 * c + 1, &hi.to_le_bytes());
                    }
                    let (sc, mn) = q4k_scales_mins(&blk.scales);
                    // The super-block's 8 lines of scales (and of mins) lie one after another.
                    self.column(self.sections.sc(sb * SUPER), &sc);
                    self.column(self.sections.mn(sb * SUPER), &mn);
                    self.f16s(self.sections.d(sb * SUPER), blk.d);
                    self.f16s(self.sections.m(sb * SUPER), blk.dmin);
                }
            }
            GgmlType::Q6_K => {
                for (sb, blk) in cast_blocks::<BlockQ6K>(src)?.iter().enumerate() {
                    let u = unpack_q6_k(blk);
                    for (j, u) in u.chunks_exact(32).enumerate() {
                        self.quants(sb * SUPER + j, u.try_into().ok()?);
                    }
                    let sc: [u8; 2 * SUPER] = std::array::from_fn(|i| blk.scales[i] as u8);
                    // The super-block's 16 lines of half-block scales lie one after another.
                    self.column(self.sections.sc(sb * SUPER), &sc);
                    self.f16s(self.sections.d(sb * SUPER), blk.d);
                }
            }
            GgmlType::F32 | GgmlType::F16 => {
                // Value k of the row goes to column k % 32 of block k / 32, at the row's place in the column.
                let size = ty.type_size();
                for (k, v) in src.chunks_exact(size).enumerate() {
                    let at = self.sections.qs(k / 32) + ((k % 32) * PANEL_ROWS + self.r) * size;
                    self.bytes[at..at + size].copy_from_slice(v);
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// Row `r`'s entry of the line of 16 f16 at `at`.
    #[inline]
    fn f16s(&mut self, at: usize, v: f16) {
        let i = at + self.r * 2;
        self.bytes[i..i + 2].copy_from_slice(&v.to_le_bytes());
    }

    /// Row `r`'s bytes of block `b` in its chunks: bytes `4j..4j + 4` of `src` (16 nibble bytes, or Q8's 32
    /// bytes) go to chunk `j`.
    #[inline]
    fn groups<const M: usize>(&mut self, b: usize, src: &[u8; M]) {
        let at = self.sections.qs(b) + 4 * self.r;
        // One bounds check for the block, then a loop of known length over it (packing a 178 MB output head spent
        // most of its instructions on per-chunk checks).
        let dst = &mut self.bytes[at..][..64 * (M / 4 - 1) + 4];
        for j in 0..M / 4 {
            dst[64 * j..64 * j + 4].copy_from_slice(&src[4 * j..4 * j + 4]);
        }
    }

    /// Row `r`'s bytes `v[i]` in the lines `i` of 16 bytes from `at` (the K formats' integer scales and mins),
    /// under one bounds check.
    fn column<const N: usize>(&mut self, at: usize, v: &[u8; N]) {
        let dst = &mut self.bytes[at + self.r..][..PANEL_ROWS * (N - 1) + 1];
        for (i, &x) in v.iter().enumerate() {
            dst[PANEL_ROWS * i] = x;
        }
    }

    /// Block `b`'s quants of row `r` for K6, from the 32 unsigned values `u` in weight order.
    fn quants(&mut self, b: usize, u: &[u8; 32]) {
        // Byte i of the row's 16 nibble bytes: weight i low, weight i + 16 high (sixteen bytes at a time in a u128).
        let (lo, hi) = (u128_at(u, 0), u128_at(u, 16));
        self.groups(b, &((lo & NIB_LO) | (hi & NIB_LO) << 4).to_le_bytes());
        // The top two bits of each weight (values are below 64), in the two chunks of bit pairs: byte i of chunk h
        // holds, from the low bits up, weights 8h + i, 16 + 8h + i, 8h + 4 + i and 20 + 8h + i.
        let top = |at: usize| u32::from_le_bytes([u[at], u[at + 1], u[at + 2], u[at + 3]]) >> 4 & 0x0303_0303;
        let pairs = |h: usize| top(8 * h) | top(16 + 8 * h) << 2 | top(8 * h + 4) << 4 | top(20 + 8 * h) << 6;
        let at = self.sections.qs(b) + 4 * self.r + 4 * 64;
        let dst = &mut self.bytes[at..][..64 + 4];
        dst[..4].copy_from_slice(&pairs(0).to_le_bytes());
        dst[64..].copy_from_slice(&pairs(1).to_le_bytes());
    }
}

/// The low nibble of every byte of a u128.
const NIB_LO: u128 = 0x0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F;

/// The top bit of every byte of a u128: xored in, it turns signed bytes into unsigned ones biased by 128.
const BIAS8: u128 = 0x8080_8080_8080_8080_8080_8080_8080_8080;

/// Bytes `at..at + 16` of `b` as a little-endian u128.
#[inline]
fn u128_at(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().unwrap())
}

fn lines_as_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: `Line` is `repr(C)` around `[u8; 64]` with no padding (size 64 = align 64), so a slice of lines is
    // exactly `64 · len` initialised bytes.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}

fn lines_as_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: as in `lines_as_bytes_mut`.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), lines.len() * 64) }
}

impl PackedMatrix {
    pub fn view(&self) -> PackedView<'_> {
        PackedView {
            format: self.format,
            nb: self.cols / 32,
            n_panels: self.rows / PANEL_ROWS,
            panel_bytes: self.panel_bytes,
            bytes: lines_as_bytes(&self.storage[self.lines.clone()]),
        }
    }

    /// The GGUF type the panels were made from.
    pub fn source(&self) -> GgmlType {
        self.source
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (the panels, padding included).
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }
}

impl<'a> PackedView<'a> {
    /// Panel `p`'s bytes.
    pub fn panel(&self, p: usize) -> &'a [u8] {
        &self.bytes[p * self.panel_bytes..(p + 1) * self.panel_bytes]
    }

    /// Unsigned quant of row `r` (0..16), weight `k` (0..32) of block `b` in panel `p`.
    pub fn quant(&self, p: usize, b: usize, r: usize, k: usize) -> u8 {
        let at = self.sections().qs(b);
        let blk = &self.panel(p)[at..at + self.format.qs_bytes()];
        if self.format == PackedFormat::Q8 {
            return blk[(k / 4) * 64 + 4 * r + k % 4];
        }
        let (j, i, high) = ((k % 16) / 4, k % 4, k >= 16);
        let v = blk[j * 64 + 4 * r + i];
        let low4 = if high { v >> 4 } else { v & 0x0F };
        match self.format {
            PackedFormat::Q5 => {
                let qh = u32::from_le_bytes(blk[256 + 4 * r..256 + 4 * r + 4].try_into().unwrap());
                low4 | (((qh >> k) & 1) as u8) << 4
            }
            PackedFormat::K6 => {
                let pairs = blk[(4 + j / 2) * 64 + 4 * r + i];
                let shift = 4 * (j % 2) + 2 * usize::from(high);
                low4 | ((pairs >> shift) & 3) << 4
            }
            _ => low4,
        }
    }

    /// Row `r`'s entry of the line of 16 f16 at `at` in panel `p`.
    fn f16_at(&self, p: usize, at: usize, r: usize) -> f32 {
        let i = at + r * 2;
        let s = &self.panel(p)[i..i + 2];
        f16::from_le_bytes([s[0], s[1]]).to_f32()
    }

    /// Row `r`'s entry of the line of 16 bytes at `at` in panel `p`.
    fn byte_at(&self, p: usize, at: usize, r: usize) -> u8 {
        self.panel(p)[at + r]
    }

    /// Where the quants and scales of this matrix's panels lie.
    pub fn sections(&self) -> Sections {
        Sections::of(self.format, self.nb)
    }

    /// The scale of row `r`'s weights `16·half..16·half + 16` in block `b` of panel `p` (the same for both halves
    /// except in K6). For the K formats it is `d·sc` in f32, the product the kernels form.
    pub fn scale(&self, p: usize, b: usize, r: usize, half: usize) -> f32 {
        let sec = self.sections();
        match self.format {
            PackedFormat::K4 => self.f16_at(p, sec.d(b), r) * self.byte_at(p, sec.sc(b), r) as f32,
            PackedFormat::K6 => {
                self.f16_at(p, sec.d(b), r) * self.byte_at(p, sec.sc(b) + PANEL_ROWS * half, r) as i8 as f32
            }
            _ => self.f16_at(p, sec.d(b), r),
        }
    }

    /// Scale `d` of row `r`, block `b` in panel `p` (for K6, that of the block's first 16 weights).
    pub fn d(&self, p: usize, b: usize, r: usize) -> f32 {
        self.scale(p, b, r, 0)
    }

    /// Offset `m` of row `r`, block `b` in panel `p` (0 for formats without one; for K4 `−dmin·mn`, in f32).
    pub fn m(&self, p: usize, b: usize, r: usize) -> f32 {
        let sec = self.sections();
        match self.format {
            PackedFormat::Q4 | PackedFormat::Q5 => self.f16_at(p, sec.m(b), r),
            PackedFormat::K4 => -(self.f16_at(p, sec.m(b), r) * self.byte_at(p, sec.mn(b), r) as f32),
            _ => 0.0,
        }
    }

    /// The value of row `r`'s weight `k` of block `b` in panel `p`: `scale·(u − OFF) + m`, or the stored value of
    /// the float formats.
    pub fn weight(&self, p: usize, b: usize, r: usize, k: usize) -> f32 {
        if self.format.is_float() {
            let at = self.sections().qs(b);
            let blk = &self.panel(p)[at..at + self.format.qs_bytes()];
            let at = k * PANEL_ROWS + r;
            return match self.format {
                PackedFormat::F32 => f32::from_le_bytes(blk[4 * at..4 * at + 4].try_into().unwrap()),
                _ => f16::from_le_bytes([blk[2 * at], blk[2 * at + 1]]).to_f32(),
            };
        }
        let u = self.quant(p, b, r, k) as i32 - self.format.offset();
        self.scale(p, b, r, k / 16) * u as f32 + self.m(p, b, r)
    }
}

/// Checks the arguments every panel kernel relies on; the SIMD kernels index without bounds checks after it.
pub(crate) fn check_args(w: &PackedView<'_>, panels: &Range<usize>, act: &Act32<'_>, n_act: usize, group: usize) {
    assert!(!w.format.is_float(), "a float panel takes f32 activations");
    assert!(group == 1 || group == 2, "activation group must be 1 or 2");
    assert!(n_act.is_multiple_of(group), "activation rows must come in whole groups");
    check_panels(w, panels);
    let n = n_act * w.nb;
    assert!(act.qs.len() >= n * 32 && act.d.len() >= n && act.s.len() >= n && act.isum.len() >= n);
}

/// As [`check_args`], for the float formats: `n_act` rows of f32 activations in `x`.
pub(crate) fn check_args_f(w: &PackedView<'_>, panels: &Range<usize>, x: &[f32], n_act: usize) {
    assert!(w.format.is_float(), "only a float panel takes f32 activations");
    check_panels(w, panels);
    assert!(x.len() >= n_act * w.nb * 32, "activation rows out of range");
}

fn check_panels(w: &PackedView<'_>, panels: &Range<usize>) {
    assert!(panels.start <= panels.end && panels.end <= w.n_panels, "panel range out of the matrix");
    assert!(w.panel_bytes >= panel_bytes(w.format, w.nb) && w.bytes.len() >= w.n_panels * w.panel_bytes);
    assert!(w.bytes.as_ptr().align_offset(64) == 0 && w.panel_bytes.is_multiple_of(64), "panels must be aligned");
}

/// The reference kernel for float panels (see [`crate::dispatch::PanelPackedF`]): output row `o`, column
/// `16·p + r` is `acc = fma(w_k, x_k, acc)` over the columns `k` in order, from 0: one chain of fused
/// multiply-adds per output, whatever the tile.
pub fn panel_ref_f(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    check_args_f(&w, &panels, x, n_act);
    let cols = w.nb * 32;
    for p in panels {
        for o in 0..n_act {
            for r in 0..PANEL_ROWS {
                let mut acc = 0f32;
                for k in 0..cols {
                    acc = w.weight(p, k / 32, r, k % 32).mul_add(x[o * cols + k], acc);
                }
                out.put(o, p * PANEL_ROWS + r, acc);
            }
        }
    }
}

/// The reference panel kernel: weight rows of panels `panels` against `n_act` activation rows in groups of
/// `group` (see [`crate::dispatch::Panel32`]); output row `a / group`, column `16·p + r`.
///
/// Per output, per block, in this order: for each half block `h` with a scale of its own (K6; else the whole
/// block as one), the integer dot product `i = Σ u·q − OFF·Σq` over its weights (for a Q8x2 pair `256·i₁ + i₂`),
/// then `acc = fma(i, scale·d_a, acc)` with `d_a` the (last) activation row's scale; then for formats with an
/// offset `acc = fma(m, s_a, acc)` with `s_a` the first row's `s`.
pub fn panel_ref(
    w: PackedView<'_>,
    panels: Range<usize>,
    act: Act32<'_>,
    n_act: usize,
    group: usize,
    out: &OutSink<'_>,
) {
    check_args(&w, &panels, &act, n_act, group);
    let nb = w.nb;
    let off = w.format.offset();
    // The weights each integer sum covers: the two half blocks, or the whole block.
    let parts: &[(usize, usize)] = if w.format.split_halves() { &[(0, 16), (16, 32)] } else { &[(0, 32)] };
    for p in panels {
        for o in 0..n_act / group {
            for r in 0..PANEL_ROWS {
                let mut acc = 0f32;
                for b in 0..nb {
                    let (_, da, _, _) = act.block(o * group + group - 1, nb, b);
                    let (_, _, sa, _) = act.block(o * group, nb, b);
                    for &(k0, k1) in parts {
                        let mut iv = 0i32;
                        for g in 0..group {
                            let (q, _, _, _) = act.block(o * group + g, nb, b);
                            let dot: i32 = (k0..k1).map(|k| w.quant(p, b, r, k) as i32 * q[k] as i32).sum();
                            let sum: i32 = (k0..k1).map(|k| q[k] as i32).sum();
                            iv = iv * 256 + (dot - off * sum);
                        }
                        acc = (iv as f32).mul_add(w.scale(p, b, r, k0 / 16) * da, acc);
                    }
                    if w.format.has_min() {
                        acc = w.m(p, b, r).mul_add(sa, acc);
                    }
                }
                out.put(o, p * PANEL_ROWS + r, acc);
            }
        }
    }
}
