//! Weights repacked at load time into 16-row interleaved panels, for the wide integer kernels.
//!
//! In GGUF a weight row's blocks lie one after another, so a SIMD kernel working row by row must reduce each dot
//! product across its lanes and pay a float epilogue (convert, scale, add) per row, block and activation row. At
//! batch sizes above one that epilogue, not the multiply-adds, is the cost. A panel turns the problem around: the
//! four-byte groups of 16 consecutive rows are interleaved, so one 512-bit `vpdpbusd` with a broadcast group of
//! four activation bytes advances all 16 rows at once, lane `r` belonging to row `r`. Nothing is reduced across
//! lanes, each block's epilogue serves 16 rows, and the 16 results of a panel are contiguous in the output.
//!
//! Layout of one panel (16 rows × `nb` 32-weight blocks), 64-byte aligned:
//!
//! ```text
//! qs   nb × QS bytes   block b: QS/64 chunks of 64 bytes; chunk j holds, for rows r = 0..16, a 4-byte group of
//!                      row r at bytes 4r..4r+4
//! d    nb × 16 f16     block b: the 16 rows' scales
//! m    nb × 16 f16     block b: the 16 rows' offsets (Q4 and Q5 only)
//! ```
//!
//! - [`PackedFormat::Q4`] (from Q4_0 and Q4_1): chunk `j` (0..4) holds the nibble bytes `4j..4j+4` of each row,
//!   so its low nibbles are weights `4j..4j+4` and its high nibbles weights `16+4j..16+4j+4`, exactly as in the
//!   GGUF block. Weight = `d·u + m` with `u` the nibble; Q4_0's `m` is `-8·d`.
//! - [`PackedFormat::Q5`] (from Q5_0): the Q4 chunks, then a fifth 64-byte chunk holding each row's 32 high bits
//!   (the GGUF `qh`, bit k for weight k) at bytes 4r..4r+4. Weight = `d·u + m` with `u` the 5-bit value and
//!   `m = -16·d`.
//! - [`PackedFormat::Q8`] (from Q8_0): chunk `j` (0..8) holds weights `4j..4j+4` of each row, biased by +128 so
//!   they are unsigned (`vpdpbusd` multiplies unsigned by signed bytes); the kernel takes `128·Σq` back out in the
//!   integers. Weight = `d·(u − 128)`.
//!
//! Packing keeps every bit of the source: the panels hold the same quants and the same f16 scales, only moved.
//! The scalar [`panel_ref`] states exactly what the SIMD kernel computes, in the same order of float
//! operations, so the two agree bit for bit.

use std::fmt;
use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use crate::GgmlType;
use crate::dispatch::{Act32, OutSink};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, cast_blocks};

/// Rows per panel: one i32 lane each in a 512-bit register.
pub const PANEL_ROWS: usize = 16;

/// How a panel's quants are stored (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    /// Unsigned nibbles with a scale and an offset per row and block (Q4_0, Q4_1).
    Q4,
    /// Nibbles plus a plane of high bits, with a scale and an offset (Q5_0).
    Q5,
    /// Bytes biased to unsigned, with a scale per row and block (Q8_0).
    Q8,
}

impl PackedFormat {
    /// Quant bytes per block of a whole panel.
    pub const fn qs_bytes(self) -> usize {
        match self {
            PackedFormat::Q4 => PANEL_ROWS * 16,
            PackedFormat::Q5 => PANEL_ROWS * 20,
            PackedFormat::Q8 => PANEL_ROWS * 32,
        }
    }

    /// Whether the panel carries per-block offsets `m`.
    pub const fn has_min(self) -> bool {
        matches!(self, PackedFormat::Q4 | PackedFormat::Q5)
    }

    /// The bias the integer dot product must take back out, times Σq.
    pub const fn offset(self) -> i32 {
        match self {
            PackedFormat::Q4 | PackedFormat::Q5 => 0,
            PackedFormat::Q8 => 128,
        }
    }

    /// The packed format for GGUF type `ty`, if there is one.
    pub fn for_type(ty: GgmlType) -> Option<PackedFormat> {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => Some(PackedFormat::Q4),
            GgmlType::Q5_0 => Some(PackedFormat::Q5),
            GgmlType::Q8_0 => Some(PackedFormat::Q8),
            _ => None,
        }
    }
}

/// One cache line, so the buffer of lines is 64-byte aligned without any unsafe allocation.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight matrix in panels (owned; made once at load by [`pack`]).
pub struct PackedMatrix {
    source: GgmlType,
    format: PackedFormat,
    rows: usize,
    cols: usize,
    panel_bytes: usize,
    lines: Vec<Line>,
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
    let scales = if format.has_min() { 2 } else { 1 } * PANEL_ROWS * 2;
    (nb * (format.qs_bytes() + scales)).next_multiple_of(64)
}

/// Repacks `rows × cols` weights of type `ty` (GGUF bytes `data`) into panels. `None` when there is no packed
/// form: another type, rows not a multiple of [`PANEL_ROWS`], a size that does not match, or a Q4_0 scale so
/// large that its offset `-8·d` would overflow f16. The caller then keeps the GGUF layout and its kernels.
pub fn pack(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Option<PackedMatrix> {
    let format = PackedFormat::for_type(ty)?;
    if rows == 0 || !rows.is_multiple_of(PANEL_ROWS) || !cols.is_multiple_of(32) || cols == 0 {
        return None;
    }
    let nb = cols / 32;
    if rows.checked_mul(nb)?.checked_mul(ty.type_size())? != data.len() {
        return None;
    }
    let pb = panel_bytes(format, nb);
    let mut lines = vec![Line([0; 64]); rows / PANEL_ROWS * pb / 64];
    // Scaling by a power of two is exact in f16 unless it overflows; such a block keeps the GGUF layout.
    let offset = |d: f16, by: f32| Some(f16::from_f32(by * d.to_f32())).filter(|m| m.is_finite());
    let ok = match ty {
        GgmlType::Q4_1 => {
            let blocks: &[BlockQ4_1] = cast_blocks(data)?;
            fill(&mut lines, format, pb, nb, |r, b| {
                let blk = &blocks[r * nb + b];
                Some(Src { qs: &blk.qs, qh: None, d: blk.d, m: blk.m })
            })
        }
        GgmlType::Q4_0 => {
            let blocks: &[BlockQ4_0] = cast_blocks(data)?;
            fill(&mut lines, format, pb, nb, |r, b| {
                let blk = &blocks[r * nb + b];
                Some(Src { qs: &blk.qs, qh: None, d: blk.d, m: offset(blk.d, -8.0)? })
            })
        }
        GgmlType::Q5_0 => {
            let blocks: &[BlockQ5_0] = cast_blocks(data)?;
            fill(&mut lines, format, pb, nb, |r, b| {
                let blk = &blocks[r * nb + b];
                Some(Src { qs: &blk.qs, qh: Some(blk.qh), d: blk.d, m: offset(blk.d, -16.0)? })
            })
        }
        GgmlType::Q8_0 => {
            let blocks: &[BlockQ8_0] = cast_blocks(data)?;
            fill(&mut lines, format, pb, nb, |r, b| {
                let blk = &blocks[r * nb + b];
                Some(Src { qs: i8_bytes(&blk.qs), qh: None, d: blk.d, m: f16::ZERO })
            })
        }
        _ => return None,
    };
    ok.then_some(PackedMatrix { source: ty, format, rows, cols, panel_bytes: pb, lines })
}

fn i8_bytes(q: &[i8; 32]) -> &[u8] {
    // i8 and u8 have the same size and alignment, and every bit pattern is valid for both.
    // SAFETY: see above; the slice covers exactly the 32 bytes of `q`.
    unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), 32) }
}

/// One GGUF block's parts, as [`fill`] takes them.
struct Src<'a> {
    /// Nibble bytes (Q4/Q5) or the signed bytes (Q8).
    qs: &'a [u8],
    /// Q5's 32 high bits.
    qh: Option<[u8; 4]>,
    d: f16,
    m: f16,
}

/// Fills every panel from `get(row, block)`, in parallel over panels. False if `get` refused a block.
fn fill<'a>(
    lines: &mut [Line],
    format: PackedFormat,
    pb: usize,
    nb: usize,
    get: impl Fn(usize, usize) -> Option<Src<'a>> + Sync,
) -> bool {
    let qsb = format.qs_bytes();
    lines.par_chunks_mut(pb / 64).enumerate().all(|(p, panel)| {
        let bytes = lines_as_bytes_mut(panel);
        for b in 0..nb {
            for r in 0..PANEL_ROWS {
                let Some(src) = get(p * PANEL_ROWS + r, b) else { return false };
                let blk = &mut bytes[b * qsb..(b + 1) * qsb];
                // Each 4-byte group of the row goes to chunk j, at the row's 4 bytes.
                for (j, group) in src.qs.chunks_exact(4).enumerate() {
                    let dst = &mut blk[j * 64 + 4 * r..j * 64 + 4 * r + 4];
                    for (o, &v) in dst.iter_mut().zip(group) {
                        *o = if format == PackedFormat::Q8 { v ^ 0x80 } else { v };
                    }
                }
                if let Some(qh) = src.qh {
                    blk[256 + 4 * r..256 + 4 * r + 4].copy_from_slice(&qh);
                }
                let scales = nb * qsb;
                let di = scales + (b * PANEL_ROWS + r) * 2;
                bytes[di..di + 2].copy_from_slice(&src.d.to_le_bytes());
                if format.has_min() {
                    let mi = scales + (nb * PANEL_ROWS + b * PANEL_ROWS + r) * 2;
                    bytes[mi..mi + 2].copy_from_slice(&src.m.to_le_bytes());
                }
            }
        }
        true
    })
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
            bytes: lines_as_bytes(&self.lines),
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
        let qsb = self.format.qs_bytes();
        let blk = &self.panel(p)[b * qsb..(b + 1) * qsb];
        match self.format {
            PackedFormat::Q4 | PackedFormat::Q5 => {
                let (j, i, high) = if k < 16 { (k / 4, k % 4, false) } else { ((k - 16) / 4, k % 4, true) };
                let v = blk[j * 64 + 4 * r + i];
                let low4 = if high { v >> 4 } else { v & 0x0F };
                if self.format == PackedFormat::Q5 {
                    let qh = u32::from_le_bytes(blk[256 + 4 * r..256 + 4 * r + 4].try_into().unwrap());
                    low4 | (((qh >> k) & 1) as u8) << 4
                } else {
                    low4
                }
            }
            PackedFormat::Q8 => blk[(k / 4) * 64 + 4 * r + k % 4],
        }
    }

    fn scale(&self, p: usize, which: usize, b: usize, r: usize) -> f32 {
        let i = self.nb * self.format.qs_bytes() + ((which * self.nb + b) * PANEL_ROWS + r) * 2;
        let s = &self.panel(p)[i..i + 2];
        f16::from_le_bytes([s[0], s[1]]).to_f32()
    }

    /// Scale `d` of row `r`, block `b` in panel `p`.
    pub fn d(&self, p: usize, b: usize, r: usize) -> f32 {
        self.scale(p, 0, b, r)
    }

    /// Offset `m` of row `r`, block `b` in panel `p` (0 for formats without one).
    pub fn m(&self, p: usize, b: usize, r: usize) -> f32 {
        if self.format.has_min() { self.scale(p, 1, b, r) } else { 0.0 }
    }
}

/// Checks the arguments every panel kernel relies on; the SIMD kernels index without bounds checks after it.
pub(crate) fn check_args(w: &PackedView<'_>, panels: &Range<usize>, act: &Act32<'_>, n_act: usize, group: usize) {
    assert!(group == 1 || group == 2, "activation group must be 1 or 2");
    assert!(n_act.is_multiple_of(group), "activation rows must come in whole groups");
    assert!(panels.start <= panels.end && panels.end <= w.n_panels, "panel range out of the matrix");
    assert!(w.panel_bytes >= panel_bytes(w.format, w.nb) && w.bytes.len() >= w.n_panels * w.panel_bytes);
    assert!(w.bytes.as_ptr().align_offset(64) == 0 && w.panel_bytes.is_multiple_of(64), "panels must be aligned");
    let n = n_act * w.nb;
    assert!(act.qs.len() >= n * 32 && act.d.len() >= n && act.s.len() >= n && act.isum.len() >= n);
}

/// The reference panel kernel: weight rows of panels `panels` against `n_act` activation rows in groups of
/// `group` (see [`crate::dispatch::Panel32`]); output row `a / group`, column `16·p + r`.
///
/// Per output, per block, in this order: the integer dot product `i = Σ u·q − OFF·Σq` (for a Q8x2 pair
/// `256·i₁ + i₂`), then `acc = fma(i, d·d_a, acc)` with `d_a` the (last) activation row's scale, then for Q4/Q5
/// `acc = fma(m, s_a, acc)` with `s_a` the first row's `s`.
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
    for p in panels {
        for o in 0..n_act / group {
            for r in 0..PANEL_ROWS {
                let mut acc = 0f32;
                for b in 0..nb {
                    let mut iv = 0i32;
                    for g in 0..group {
                        let (q, _, _, isum) = act.block(o * group + g, nb, b);
                        let dot: i32 = (0..32).map(|k| w.quant(p, b, r, k) as i32 * q[k] as i32).sum();
                        iv = iv * 256 + (dot - off * isum);
                    }
                    let (_, da, _, _) = act.block(o * group + group - 1, nb, b);
                    let (_, _, sa, _) = act.block(o * group, nb, b);
                    acc = (iv as f32).mul_add(w.d(p, b, r) * da, acc);
                    if w.format.has_min() {
                        acc = w.m(p, b, r).mul_add(sa, acc);
                    }
                }
                out.put(o, p * PANEL_ROWS + r, acc);
            }
        }
    }
}
