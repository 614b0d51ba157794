//! Run-time choice of the instruction-set level, and the table of kernels for it.
//!
//! The level is detected once (`is_x86_feature_detected!`), or forced with `INFER_ISA=scalar|avx2|avx512|amx`. Each
//! level has a `&'static` [`Kernels`] table of plain safe `fn` pointers. The SIMD entries are safe wrappers around
//! `#[target_feature]` functions, so a table is only ever handed out (by [`Isa::kernels`] / [`kernels`]) after the
//! CPU was checked to have every feature its level needs: that check is what makes calling through it sound.
//!
//! The kernels themselves work on *panels*: a range of weight rows against a set of quantized activation rows,
//! writing one output per (activation group, weight row). A plain vector dot product is the 1×1 panel
//! ([`Kernels::vec_dot_q4_1`] and friends).

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::OnceLock;

use half::f16;

use crate::packed::{PackedFormat, PackedView};
use crate::quant::{BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8K};
use crate::vec_f32::{AxpyRows, SoftmaxState};

/// An instruction-set level the kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, any CPU.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 level plus AVX-512 F, BW, VL and VNNI (8-bit dot products in one instruction).
    Avx512,
    /// AVX-512 level plus AMX tiles with bf16 and int8 products (`tdpbf16ps`, `tdpbsud`), which the OS lets the
    /// process use: the prefill and batches of F16 weights and of the 32-weight quantized panels (Q4_0, Q4_1, Q5_0,
    /// Q8_0) run on the tile unit.
    Amx,
}

impl Isa {
    /// Every level, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// `scalar`, `avx2`, `avx512` or `amx` (the spelling `INFER_ISA` accepts).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The widest vector instructions of this level: `amx` runs the AVX-512 level's vector code around its
    /// tiles, so for everything but its tile kernels it is that level.
    pub fn vectors(self) -> Isa {
        match self {
            Isa::Amx => Isa::Avx512,
            other => other,
        }
    }

    /// Parses `scalar`, `avx2`, `avx512` or `amx` (case-insensitive).
    pub fn from_name(s: &str) -> Option<Isa> {
        Self::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run this level.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.is_supported() && crate::arch::amx::supported(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU can run, slowest first (for tests that compare all of them).
    pub fn available() -> Vec<Isa> {
        Self::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// The fastest level this CPU can run.
    pub fn best() -> Isa {
        Self::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Scalar)
    }

    /// How many of `n_act` activation rows this level's float panel kernel ([`Kernels::packed_f`]) multiplies in
    /// bf16 parts on the tile unit, within a bound of the f32 result rather than equal to it bit for bit as the
    /// multiply-add levels are: only `amx` does, for whole tiles of 16 rows once there are enough of them (see
    /// `arch/x86_64/amx.rs`).
    pub fn float_tile_rows(self, format: crate::packed::PackedFormat, n_act: usize) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => crate::arch::amx::tiled_rows(format, n_act),
            _ => {
                let _ = (format, n_act);
                0
            }
        }
    }

    /// This level's kernel table, or an error if the CPU lacks a feature it needs.
    pub fn kernels(self) -> Result<&'static Kernels, IsaError> {
        if !self.is_supported() {
            return Err(IsaError::Unsupported(self));
        }
        Ok(match self {
            Isa::Scalar => &crate::arch::scalar::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &crate::arch::avx2::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &crate::arch::avx512::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => &crate::arch::amx::KERNELS,
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("is_supported() is false off x86-64"),
        })
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the requested instruction-set level cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsaError {
    /// `INFER_ISA` holds something other than `scalar`, `avx2`, `avx512` or `amx`.
    Unknown(String),
    /// The level exists but this CPU lacks one of its features.
    Unsupported(Isa),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::Unknown(s) => {
                write!(f, "INFER_ISA={s:?} is not a known level (expected scalar, avx2, avx512 or amx)")
            }
            IsaError::Unsupported(isa) => write!(
                f,
                "INFER_ISA={isa}: this CPU lacks a feature that level needs (it supports: {})",
                Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

impl std::error::Error for IsaError {}

static CHOSEN: OnceLock<Result<Isa, IsaError>> = OnceLock::new();

fn choose() -> Result<Isa, IsaError> {
    match std::env::var("INFER_ISA") {
        Ok(s) if !s.trim().is_empty() => {
            let isa = Isa::from_name(&s).ok_or(IsaError::Unknown(s))?;
            if isa.is_supported() { Ok(isa) } else { Err(IsaError::Unsupported(isa)) }
        }
        _ => Ok(Isa::best()),
    }
}

/// The level in use: `INFER_ISA` if set (and valid), else the fastest this CPU has. Decided once.
pub fn try_isa() -> Result<Isa, IsaError> {
    CHOSEN.get_or_init(choose).clone()
}

/// [`try_isa`], panicking with its message on a bad `INFER_ISA` (call `try_isa` first to report it nicely).
pub fn isa() -> Isa {
    match try_isa() {
        Ok(isa) => isa,
        Err(e) => panic!("{e}"),
    }
}

/// The size of the L1 data cache in bytes, where CPUID states it. The AVX-512 decode kernels prefetch their weight
/// streams into L2 instead of L1 when it is 32 KB or less.
pub fn l1d_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    return crate::arch::cache::l1d_bytes();
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The size of the last-level (L3) cache in bytes, where CPUID states it. On Intel cores the AVX-512 decode
/// kernels stream weights a short way ahead into L2 once the packed weights outgrow a third of it (they then come
/// from DRAM).
pub fn l3_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    return crate::arch::cache::l3_bytes();
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The kernel table of [`isa()`].
pub fn kernels() -> &'static Kernels {
    static TABLE: OnceLock<&'static Kernels> = OnceLock::new();
    TABLE.get_or_init(|| isa().kernels().expect("isa() only returns supported levels"))
}

/// Int8 activations in 32-value blocks, for the Q8_0/Q4_0/Q4_1/Q5_0 weight kernels: `x ≈ d · q` per block.
///
/// Row `a` of `n` rows with `nb` blocks each: `qs[a*nb*32..][..nb*32]`, `d/s/isum[a*nb..][..nb]`. The quants are
/// contiguous (unlike `BlockQ8_0`) so a SIMD load takes a whole block. `isum` is the block's Σq and `s = d · Σq`:
/// they carry the offset terms (`-8`, `-16`, Q4_1's `+m`) so weights stay unsigned in the inner loop.
///
/// Pairs (`group == 2` in [`Panel32`], [`crate::matmul::ActPrecision::Q8x2`]): rows `2i` and `2i + 1` are one
/// activation row split as `x ≈ d1·q1 + d2·q2` with, block by block, `d2 = d1 / 256` exactly, and `s` of row `2i`
/// holding the pair's `d1·Σq1 + d2·Σq2` (row `2i + 1`'s `s` is unused). The kernels then combine
/// `256·Σ w·q1 + Σ w·q2` in the integers and scale once; [`quantize_row32`] produces this layout.
#[derive(Clone, Copy, Debug)]
pub struct Act32<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub isum: &'a [i32],
}

impl<'a> Act32<'a> {
    /// Block `b` of row `a` when rows have `nb` blocks: (quants, d, s, isum).
    #[inline]
    pub fn block(&self, a: usize, nb: usize, b: usize) -> (&'a [i8; 32], f32, f32, i32) {
        let i = a * nb + b;
        let q: &[i8; 32] = self.qs[i * 32..i * 32 + 32].try_into().unwrap();
        (q, self.d[i], self.s[i], self.isum[i])
    }

    /// The rows from `a0` on, renumbered from 0 (rows of `nb` blocks); empty where the buffers end before `a0`
    /// (activations a call's matrices do not use).
    pub fn rows_from(&self, a0: usize, nb: usize) -> Act32<'a> {
        let i = a0 * nb;
        Act32 {
            qs: self.qs.get(i * 32..).unwrap_or_default(),
            d: self.d.get(i..).unwrap_or_default(),
            s: self.s.get(i..).unwrap_or_default(),
            isum: self.isum.get(i..).unwrap_or_default(),
        }
    }
}

/// Converts ggml `BlockQ8_0` activations (one row) to the [`Act32`] layout, into the given buffers.
pub fn act32_from_q8_0(
    blocks: &[BlockQ8_0],
    qs: &mut Vec<i8>,
    d: &mut Vec<f32>,
    s: &mut Vec<f32>,
    isum: &mut Vec<i32>,
) {
    qs.clear();
    d.clear();
    s.clear();
    isum.clear();
    for b in blocks {
        qs.extend_from_slice(&b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        let dd = b.d.to_f32();
        d.push(dd);
        isum.push(sum);
        s.push(dd * sum as f32);
    }
}

/// Where a kernel writes its results: `out[i * stride + j]` for output row `i` (activation group) and weight row
/// `j`, restricted to the weight rows `cols` this sink was made for.
pub struct OutSink<'a> {
    ptr: *mut f32,
    len: usize,
    stride: usize,
    cols: Range<usize>,
    _life: PhantomData<&'a mut [f32]>,
}

impl<'a> OutSink<'a> {
    /// A sink over a whole output matrix with `stride` columns.
    pub fn new(out: &'a mut [f32], stride: usize) -> Self {
        OutSink { ptr: out.as_mut_ptr(), len: out.len(), stride, cols: 0..stride, _life: PhantomData }
    }

    /// A sink writing columns `cols` of a shared output matrix.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` `f32`s for `'a`, and while the sink lives nothing else may read or
    /// write the elements `i * stride + j` with `j` in `cols` (other threads may use other columns).
    pub unsafe fn from_raw(ptr: *mut f32, len: usize, stride: usize, cols: Range<usize>) -> Self {
        OutSink { ptr, len, stride, cols, _life: PhantomData }
    }

    /// The same sink with its rows renumbered from `i0`: row `i` of the result is row `i0 + i` of this one.
    pub fn rows_from(&self, i0: usize) -> OutSink<'_> {
        let skip = (i0 * self.stride).min(self.len);
        // SAFETY: `skip` ≤ len, so the pointer stays within (or one past) the sink's elements; the result borrows
        // this sink, so the two are never used at once.
        OutSink {
            ptr: unsafe { self.ptr.add(skip) },
            len: self.len - skip,
            stride: self.stride,
            cols: self.cols.clone(),
            _life: PhantomData,
        }
    }

    /// Writes `out[i][j0..j0 + v.len()] = v`.
    #[inline]
    pub fn put_row(&self, i: usize, j0: usize, v: &[f32]) {
        let idx = i * self.stride + j0;
        assert!(
            j0 >= self.cols.start && j0 + v.len() <= self.cols.end && idx + v.len() <= self.len,
            "output index out of the sink's range"
        );
        // SAFETY: idx + v.len() ≤ len and the columns j0..j0 + v.len() are this sink's, exclusive to it.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(idx), v.len()) }
    }

    /// Writes `out[i][j] = v`.
    #[inline]
    pub fn put(&self, i: usize, j: usize, v: f32) {
        let idx = i * self.stride + j;
        assert!(self.cols.contains(&j) && idx < self.len, "output index out of the sink's range");
        // SAFETY: idx < len and j is one of this sink's columns, which `new`/`from_raw` made exclusive to it.
        unsafe { self.ptr.add(idx).write(v) }
    }
}

/// Weight rows `rows` (of rows with `nb` blocks each, in `w`) against `n_act` activation rows; activation rows come
/// in groups of `group` (1, or 2 for the high+residual pairs of [`crate::matmul::ActPrecision::Q8x2`], see
/// [`Act32`]), each group giving output row `a / group`.
pub type Panel32<B> =
    fn(w: &[B], nb: usize, rows: Range<usize>, act: Act32<'_>, n_act: usize, group: usize, out: &OutSink<'_>);
/// As [`Panel32`], for K-quant weights against Q8_K activations (`act[a*nb..][..nb]` is row `a`). Here a group's
/// rows are independent quantizations whose dot products are summed.
pub type PanelK<B> =
    fn(w: &[B], nb: usize, rows: Range<usize>, act: &[BlockQ8K], n_act: usize, group: usize, out: &OutSink<'_>);
/// F32/F16 weights (`cols` per row) against f32 activation rows (`x[a*cols..][..cols]`).
pub type PanelF<T> = fn(w: &[T], cols: usize, rows: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>);

/// Panels `panels` of a [`crate::packed`] matrix against `n_act` activation rows in groups of `group`, as
/// [`Panel32`] (output column `16·panel + row`).
pub type PanelPacked =
    fn(w: PackedView<'_>, panels: Range<usize>, act: Act32<'_>, n_act: usize, group: usize, out: &OutSink<'_>);

/// Panels `panels` of a float [`crate::packed`] matrix (F32, F16) against `n_act` rows of f32 activations
/// (`x[a·cols..][..cols]`); output column `16·panel + row`.
pub type PanelPackedF = fn(w: PackedView<'_>, panels: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>);

/// [`quantize_row32`]'s signature: (x, group, qs, d, s, isum).
pub type Quantize32 = fn(&[f32], usize, &mut [i8], &mut [f32], &mut [f32], &mut [i32]);

/// Every kernel of one instruction-set level.
pub struct Kernels {
    pub isa: Isa,
    /// Σ a·b (lengths must match).
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    /// y += alpha·x.
    pub axpy_f32: fn(f32, &[f32], &mut [f32]),
    /// y *= alpha.
    pub scale_f32: fn(f32, &mut [f32]),
    /// Σ a·b with b in f16.
    pub dot_f16: fn(&[f32], &[f16]) -> f32,
    /// y += alpha·x with x in f16.
    pub axpy_f16: fn(f32, &[f16], &mut [f32]),
    pub f32: PanelF<f32>,
    pub f16: PanelF<f16>,
    pub q8_0: Panel32<BlockQ8_0>,
    pub q4_0: Panel32<BlockQ4_0>,
    pub q4_1: Panel32<BlockQ4_1>,
    pub q5_0: Panel32<BlockQ5_0>,
    pub q2_k: PanelK<BlockQ2K>,
    pub q4_k: PanelK<BlockQ4K>,
    pub q6_k: PanelK<BlockQ6K>,
    /// The kernel for [`crate::packed`] panels, on levels that have one; weights are packed at load only then.
    pub packed: Option<PanelPacked>,
    /// The kernel for float panels (F32, F16), on levels that pack them.
    pub packed_f: Option<PanelPackedF>,
    /// The panel formats `packed` and `packed_f` have SIMD code for (matrices of other types keep their GGUF
    /// layout).
    pub packed_formats: &'static [PackedFormat],
    /// [`crate::vec_f32::dot_cols`].
    pub dot_cols_f32: fn(&[f32], &[f32], usize, &mut [f32]),
    /// [`crate::vec_f32::dot_cols_f16`].
    pub dot_cols_f16: fn(&[f32], &[f16], usize, &mut [f32]),
    /// [`crate::vec_f32::axpy_rows`].
    pub axpy_rows_f32: fn(AxpyRows<'_>, &[f32], &mut [f32]),
    /// [`crate::vec_f32::axpy_rows_f16`].
    pub axpy_rows_f16: fn(AxpyRows<'_>, &[f16], &mut [f32]),
    /// [`crate::vec_f32::f16_to_f32`].
    pub f16_to_f32: fn(&[f16], &mut [f32]),
    /// [`crate::vec_f32::dequant_q8`].
    pub dequant_q8: fn(&[i8], &[f32], usize, &mut [f32]),
    /// [`crate::vec_f32::softmax_block`].
    pub softmax_block: fn(&mut [f32], f32, &mut SoftmaxState) -> f32,
    /// [`crate::vec_f32::swiglu`].
    pub swiglu: fn(&mut [f32], &[f32]),
    /// [`crate::vec_f32::geglu`].
    pub geglu: fn(&mut [f32], &[f32]),
    /// [`quantize_row32`].
    pub quantize32: Quantize32,
    /// [`crate::matmul::quantize_row_q8k`].
    pub quantize_k: fn(&[f32], usize, &mut [BlockQ8K]),
    /// Activation rows per task when [`crate::matmul`] cuts a prompt's rows into many tasks: a whole number of the
    /// panel kernels' chunks (the rows they convert at a time), so a task is the same loop over fewer chunks.
    pub task_rows: usize,
}

fn one32<B>(p: Panel32<B>, w: &[B], act: Act32<'_>) -> f32 {
    let mut o = [0f32];
    p(w, w.len(), 0..1, act, 1, 1, &OutSink::new(&mut o, 1));
    o[0]
}

fn onek<B>(p: PanelK<B>, w: &[B], act: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), act.len());
    let mut o = [0f32];
    p(w, w.len(), 0..1, act, 1, 1, &OutSink::new(&mut o, 1));
    o[0]
}

/// Vector dot products: one weight row against one activation row (the 1×1 panel).
impl Kernels {
    pub fn vec_dot_q8_0(&self, w: &[BlockQ8_0], a: Act32<'_>) -> f32 {
        one32(self.q8_0, w, a)
    }
    pub fn vec_dot_q4_0(&self, w: &[BlockQ4_0], a: Act32<'_>) -> f32 {
        one32(self.q4_0, w, a)
    }
    pub fn vec_dot_q4_1(&self, w: &[BlockQ4_1], a: Act32<'_>) -> f32 {
        one32(self.q4_1, w, a)
    }
    pub fn vec_dot_q5_0(&self, w: &[BlockQ5_0], a: Act32<'_>) -> f32 {
        one32(self.q5_0, w, a)
    }
    pub fn vec_dot_q2_k(&self, w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
        onek(self.q2_k, w, a)
    }
    pub fn vec_dot_q4_k(&self, w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        onek(self.q4_k, w, a)
    }
    pub fn vec_dot_q6_k(&self, w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
        onek(self.q6_k, w, a)
    }
}

/// Rounds to nearest (ties to even) for |y| < 2²²: adding 1.5·2²³ pushes the fraction bits out of the mantissa.
#[inline(always)]
fn round_magic(y: f32) -> f32 {
    const MAGIC: f32 = 12582912.0;
    (y + MAGIC) - MAGIC
}

/// Quantizes one activation row (`x.len()` a multiple of 32) to the [`Act32`] layout: `group == 1` gives one row
/// (`d = max|x|/127`, `q = round(x/d)`), `group == 2` two rows, the second quantizing the residual `x − d1·q1` with
/// `d2 = d1/256` (|residual| ≤ d1/2, so q2 fits in ±127 after a clamp of the extreme ±128). The buffers hold
/// `group` rows: `qs` `group·x.len()` values, the others `group·x.len()/32`.
///
/// Every level produces the same bytes (the arithmetic has no reassociation); the SIMD levels only compile the
/// same code with their target features so it vectorizes.
pub fn quantize_row32(x: &[f32], group: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32], isum: &mut [i32]) {
    (kernels().quantize32)(x, group, qs, d, s, isum)
}

/// Blocks per run in the SIMD activation quantizers: each finds the scales of a whole run before quantizing any of
/// its blocks, so the runs' dependency chains (horizontal maximum, scalar divisions, rounding, residual, sums)
/// overlap instead of following one another (about 52 → 36 cycles per Q8x2 block with AVX-512).
pub(crate) const QUANT_RUN: usize = 8;

/// `0..nb` in runs of [`QUANT_RUN`] blocks (the last may be shorter).
pub(crate) fn block_runs(nb: usize) -> impl Iterator<Item = Range<usize>> {
    (0..nb).step_by(QUANT_RUN).map(move |b0| b0..(b0 + QUANT_RUN).min(nb))
}

/// A 32-value activation block's scale from its largest magnitude, and the inverse used to quantize (0 for an
/// all-zero block). Shared by every level's quantizer, so that they all produce the same bytes, and by the 8-bit KV
/// cache's.
#[inline(always)]
pub fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// The Q8x2 residual's scale and inverse: `d/256`, so that the kernels' `256·i₁ + i₂` combination is exact.
#[inline(always)]
pub(crate) fn residual_scale(d1: f32, id1: f32) -> (f32, f32) {
    let d2 = d1 / 256.0;
    (d2, if d2 > 0.0 { 256.0 * id1 } else { 0.0 })
}

/// Stores block `b`'s scale and Σq, and `s = d·Σq` (for a pair, `s` of the first row covers both parts and the
/// residual row's is 0), in a row's arrays of `nb` blocks per part.
#[inline(always)]
pub(crate) fn put_block(
    (d, s, isum): (&mut [f32], &mut [f32], &mut [i32]),
    nb: usize,
    b: usize,
    (d1, sum1): (f32, i32),
    residual: Option<(f32, i32)>,
) {
    d[b] = d1;
    isum[b] = sum1;
    s[b] = d1 * sum1 as f32;
    if let Some((d2, sum2)) = residual {
        d[nb + b] = d2;
        isum[nb + b] = sum2;
        s[nb + b] = 0.0;
        s[b] = d1 * sum1 as f32 + d2 * sum2 as f32;
    }
}

/// The body of [`quantize_row32`], inlined into each level's entry point.
#[inline(always)]
pub(crate) fn quantize_row32_impl(
    x: &[f32],
    group: usize,
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    isum: &mut [i32],
) {
    assert!(group == 1 || group == 2);
    let cols = x.len();
    let nb = cols / 32;
    assert!(cols.is_multiple_of(32) && qs.len() == group * cols && d.len() == group * nb);
    assert!(s.len() == group * nb && isum.len() == group * nb);
    for b in 0..nb {
        let xb = &x[b * 32..b * 32 + 32];
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d1, id1) = block_scale(amax);
        let q1 = &mut qs[b * 32..b * 32 + 32];
        let mut sum1 = 0i32;
        for (q, &v) in q1.iter_mut().zip(xb) {
            let r = round_magic(v * id1).clamp(-127.0, 127.0);
            *q = r as i8;
            sum1 += r as i32;
        }
        let residual = if group == 2 {
            let (d2, id2) = residual_scale(d1, id1);
            let mut sum2 = 0i32;
            for k in 0..32 {
                let res = xb[k] - d1 * qs[b * 32 + k] as f32;
                let r = round_magic(res * id2).clamp(-127.0, 127.0);
                qs[cols + b * 32 + k] = r as i8;
                sum2 += r as i32;
            }
            Some((d2, sum2))
        } else {
            None
        };
        put_block((&mut *d, &mut *s, &mut *isum), nb, b, (d1, sum1), residual);
    }
}
