//! The matrix drivers the model calls: `out = x · Wᵀ` for a GGUF weight matrix `W` (rows = output features,
//! cols = input features) and `m` activation rows.
//!
//! Activations are quantized once per call (to int8 32-blocks with per-block sums, or Q8_K super-blocks, as the
//! weight formats need), then the weight rows are split into one contiguous range per rayon thread, and each range
//! is run through the level's panel kernel, which tiles weight rows × activation rows so every unpacked weight block
//! serves several activation rows. Each output element is computed by exactly one kernel call with a fixed order of
//! operations, so results do not depend on the number of threads, and a row of an `m > 1` product equals the
//! `m = 1` product of that row.

use std::fmt;

use crate::parallel::{self, Chunks, Rows, for_each_row};
use half::f16;

use crate::GgmlType;
use crate::dispatch::{Act32, Kernels, OutSink, kernels};
use crate::packed::{PANEL_ROWS, PackedMatrix, PackedView};
use crate::quant::{
    Block, BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8K, QK_K, cast_blocks,
};

/// Why a [`WeightMatrix`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatmulError {
    /// The weight type has no matmul kernel.
    Unsupported(GgmlType),
    /// `cols` is not a whole number of the type's blocks.
    PartialBlock { ty: GgmlType, cols: usize },
    /// `data` has the wrong number of bytes for `rows × cols`.
    Size { ty: GgmlType, rows: usize, cols: usize, expected: usize, got: usize },
    /// `data` is not aligned for the block type (mmapped GGUF data is; copy it otherwise).
    Misaligned { ty: GgmlType },
}

impl fmt::Display for MatmulError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulError::Unsupported(ty) => write!(f, "matmul with {ty} weights is not supported"),
            MatmulError::PartialBlock { ty, cols } => {
                write!(f, "{ty} rows of {cols} values are not a whole number of {}-value blocks", ty.block_size())
            }
            MatmulError::Size { ty, rows, cols, expected, got } => {
                write!(f, "{ty} matrix {rows}×{cols} needs {expected} bytes, got {got}")
            }
            MatmulError::Misaligned { ty } => write!(f, "{ty} weight data is not aligned for its block type"),
        }
    }
}

impl std::error::Error for MatmulError {}

#[derive(Clone, Copy, Debug)]
enum WData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
    Q4_1(&'a [BlockQ4_1]),
    Q5_0(&'a [BlockQ5_0]),
    Q2K(&'a [BlockQ2K]),
    Q4K(&'a [BlockQ4K]),
    Q6K(&'a [BlockQ6K]),
    /// Repacked at load into 16-row panels ([`crate::packed`]).
    Packed(PackedView<'a>),
}

/// Which activation format a weight type is dotted with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ActKind {
    F32,
    B32,
    K,
}

impl WData<'_> {
    fn act_kind(&self) -> ActKind {
        match self {
            WData::F32(_) | WData::F16(_) => ActKind::F32,
            WData::Packed(v) if v.format.is_float() => ActKind::F32,
            WData::Q8_0(_) | WData::Q4_0(_) | WData::Q4_1(_) | WData::Q5_0(_) | WData::Packed(_) => ActKind::B32,
            WData::Q2K(_) | WData::Q4K(_) | WData::Q6K(_) => ActKind::K,
        }
    }
}

/// A weight matrix in its GGUF encoding: `rows` output features, each a row of `cols` input weights.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    ty: GgmlType,
    data: WData<'a>,
    rows: usize,
    cols: usize,
}

fn cast<T: Block>(ty: GgmlType, data: &[u8]) -> Result<&[T], MatmulError> {
    cast_blocks::<T>(data).ok_or(MatmulError::Misaligned { ty })
}

impl<'a> WeightMatrix<'a> {
    /// Checks type, shape, size and alignment of `data` (`rows` rows of `cols` values of type `ty`).
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, MatmulError> {
        if !cols.is_multiple_of(ty.block_size()) {
            return Err(MatmulError::PartialBlock { ty, cols });
        }
        let expected = (cols / ty.block_size()).checked_mul(ty.type_size()).and_then(|r| r.checked_mul(rows));
        if expected != Some(data.len()) {
            return Err(MatmulError::Size {
                ty,
                rows,
                cols,
                expected: expected.unwrap_or(usize::MAX),
                got: data.len(),
            });
        }
        let data = match ty {
            GgmlType::F32 => WData::F32(cast(ty, data)?),
            GgmlType::F16 => WData::F16(cast(ty, data)?),
            GgmlType::Q8_0 => WData::Q8_0(cast(ty, data)?),
            GgmlType::Q4_0 => WData::Q4_0(cast(ty, data)?),
            GgmlType::Q4_1 => WData::Q4_1(cast(ty, data)?),
            GgmlType::Q5_0 => WData::Q5_0(cast(ty, data)?),
            GgmlType::Q2_K => WData::Q2K(cast(ty, data)?),
            GgmlType::Q4_K => WData::Q4K(cast(ty, data)?),
            GgmlType::Q6_K => WData::Q6K(cast(ty, data)?),
            _ => return Err(MatmulError::Unsupported(ty)),
        };
        Ok(WeightMatrix { ty, data, rows, cols })
    }

    /// The kernel view of a repacked matrix.
    pub fn packed(p: &'a PackedMatrix) -> Self {
        WeightMatrix { ty: p.source(), data: WData::Packed(p.view()), rows: p.rows(), cols: p.cols() }
    }

    /// Whether the matrix is in panels rather than the GGUF layout.
    pub fn is_packed(&self) -> bool {
        matches!(self.data, WData::Packed(_))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Bytes of weight data.
    pub fn bytes(&self) -> usize {
        match self.data {
            WData::Packed(v) => v.n_panels * v.panel_bytes,
            _ => self.rows * self.cols / self.ty.block_size() * self.ty.type_size(),
        }
    }
}

/// How activations are quantized for the integer kernels (F32/F16 weights always use the f32 activations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActPrecision {
    /// One int8 quantization per block (llama.cpp's accuracy).
    Q8,
    /// Int8 high part plus an int8 quantization of the residual, `x ≈ d1·q1 + d2·q2` (about 15 bits), both dotted
    /// with the same unpacked weights: near-f32 accuracy.
    Q8x2,
}

impl ActPrecision {
    /// Int8 parts per activation: how many 8-bit products an integer kernel runs per weight (unless it fuses them).
    pub fn group(self) -> usize {
        match self {
            ActPrecision::Q8 => 1,
            ActPrecision::Q8x2 => 2,
        }
    }
}

/// Reusable buffers for [`matmul`]: the quantized activations. Grown on demand, never shrunk, so a warm scratch
/// makes calls allocation-free.
pub struct MatmulScratch {
    precision: ActPrecision,
    /// The buffer (address, length) and `cols` whose rows [`MatmulScratch::prequantize`] quantized for the next call.
    pre: Option<(usize, usize, usize)>,
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    isum: Vec<i32>,
    k: Vec<BlockQ8K>,
    outs: Vec<(usize, usize)>,
}

impl MatmulScratch {
    pub fn new(precision: ActPrecision) -> Self {
        MatmulScratch {
            precision,
            pre: None,
            qs: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            isum: Vec::new(),
            k: Vec::new(),
            outs: Vec::new(),
        }
    }

    pub fn precision(&self) -> ActPrecision {
        self.precision
    }
}

/// Rounds to nearest (ties to even) for |y| < 2²²: adding 1.5·2²³ pushes the fraction bits out of the mantissa.
#[inline(always)]
fn round_magic(y: f32) -> f32 {
    const MAGIC: f32 = 12582912.0;
    (y + MAGIC) - MAGIC
}

/// Quantizes `x` (a multiple of `n` values) to symmetric int8 blocks of `n`: `d = max|x| / 127`, `q = round(x/d)`.
/// Returns the scales through `put(block, d, Σq)`. With `res`, also writes the residual `x − d·q` there.
#[inline(always)]
fn quantize_blocks(
    x: &[f32],
    q: &mut [i8],
    n: usize,
    mut res: Option<&mut [f32]>,
    mut put: impl FnMut(usize, f32, i32),
) {
    for (b, (xb, qb)) in x.chunks_exact(n).zip(q.chunks_exact_mut(n)).enumerate() {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &v) in qb.iter_mut().zip(xb) {
            // |v·id| ≤ 127 (up to rounding); the clamp guards against that last ulp.
            let r = round_magic(v * id).clamp(-127.0, 127.0);
            *qv = r as i8;
            sum += r as i32;
        }
        if let Some(res) = res.as_deref_mut() {
            for ((rv, &v), &qv) in res[b * n..(b + 1) * n].iter_mut().zip(xb).zip(qb.iter()) {
                *rv = v - d * qv as f32;
            }
        }
        put(b, d, sum);
    }
}

/// One activation row to Q8_K (`d = max|x|/127`, symmetric); with `group == 2` two rows, the second an
/// independent quantization of the residual `x − d1·q1`. `out` holds `group · x.len()/256` blocks.
pub fn quantize_row_q8k(x: &[f32], group: usize, out: &mut [BlockQ8K]) {
    (kernels().quantize_k)(x, group, out)
}

/// The body of [`quantize_row_q8k`], inlined into each level's entry point.
#[inline(always)]
pub(crate) fn quantize_row_k_impl(x: &[f32], group: usize, out: &mut [BlockQ8K]) {
    assert!((group == 1 || group == 2) && out.len() == group * (x.len() / QK_K) && x.len().is_multiple_of(QK_K));
    let nb = x.len() / QK_K;
    let mut res_buf = [0f32; QK_K];
    for b in 0..nb {
        let xb = &x[b * QK_K..(b + 1) * QK_K];
        let (lo, hi) = out.split_at_mut(nb);
        let blk = &mut lo[b];
        let res = if group == 2 { Some(&mut res_buf[..]) } else { None };
        let mut dd = 0.0;
        quantize_blocks(xb, &mut blk.qs, QK_K, res, |_, d, _| dd = d);
        blk.d = dd;
        for (s, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        if group == 2 {
            let blk = &mut hi[b];
            quantize_blocks(&res_buf, &mut blk.qs, QK_K, None, |_, d, _| dd = d);
            blk.d = dd;
            for (s, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
        }
    }
}

/// Activation rows at or above this count are quantized in parallel.
const PAR_QUANT_ROWS: usize = 8;

impl MatmulScratch {
    /// The 32-block activation slots for `m` rows of `cols`, grown as needed, to be filled row by row with `kern`'s
    /// quantizer (by [`MatmulScratch::quantize32`] or, ahead of the call, by the producer of the rows).
    fn act32_rows<'a>(&'a mut self, kern: &'a Kernels, m: usize, cols: usize) -> PreQuant<'a> {
        let g = self.precision.group();
        let nb = cols / 32;
        let n_act = m * g;
        self.qs.resize(self.qs.len().max(n_act * cols), 0);
        self.d.resize(self.d.len().max(n_act * nb), 0.0);
        self.s.resize(self.s.len().max(n_act * nb), 0.0);
        self.isum.resize(self.isum.len().max(n_act * nb), 0);
        PreQuant {
            qs: Chunks::new(&mut self.qs[..n_act * cols], g * cols),
            d: Chunks::new(&mut self.d[..n_act * nb], g * nb),
            s: Chunks::new(&mut self.s[..n_act * nb], g * nb),
            isum: Chunks::new(&mut self.isum[..n_act * nb], g * nb),
            g,
            kern,
        }
    }

    /// Quantizes activation rows in the pass that produces them, ahead of the next [`matmul_multi`] on `x` (rows of
    /// `cols` values, about to be written): that call then skips its own quantization pass (with threads, a parallel
    /// region). Fill every row through the returned [`PreQuant`] with exactly the values written to `x`. Quantizing
    /// in the producer's pass gives the same bytes as the matmul's own pass. The next call uses the rows only if it
    /// is on the same buffer; any call consumes them.
    ///
    /// Returns `None` when the matrices do not take 32-block activations (F32/F16 or K-quant weights); then quantize
    /// nothing and call as usual.
    pub fn prequantize(&mut self, ws: &[&WeightMatrix], x: &[f32], cols: usize) -> Option<PreQuant<'_>> {
        self.pre = None;
        if cols == 0 || !cols.is_multiple_of(32) || !ws.iter().any(|w| w.data.act_kind() == ActKind::B32) {
            return None;
        }
        assert!(x.len().is_multiple_of(cols), "prequantize: {} values are not whole rows of {cols}", x.len());
        self.pre = Some((x.as_ptr() as usize, x.len(), cols));
        Some(self.act32_rows(kernels(), x.len() / cols, cols))
    }

    fn quantize32(&mut self, kern: &Kernels, x: &[f32], m: usize, cols: usize) {
        let rows = self.act32_rows(kern, m, cols);
        for_each_row(rows, m >= PAR_QUANT_ROWS, |t, mut r| r.quantize(&x[t * cols..(t + 1) * cols]));
    }

    fn quantize_k(&mut self, kern: &Kernels, x: &[f32], m: usize, cols: usize) {
        let g = self.precision.group();
        let nb = cols / QK_K;
        let n = m * g * nb;
        if self.k.len() < n {
            self.k.resize(n, BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] });
        }
        let k = Chunks::new(&mut self.k[..n], g * nb);
        for_each_row(k, m >= PAR_QUANT_ROWS, |t, o| (kern.quantize_k)(&x[t * cols..(t + 1) * cols], g, o));
    }
}

/// Activation rows to be quantized by the pass that produces them (see [`MatmulScratch::prequantize`]), one
/// [`QuantRow`] per index for [`crate::parallel::for_each_row`]: per row, `g` parts' quants and block arrays.
pub struct PreQuant<'a> {
    qs: Chunks<'a, i8>,
    d: Chunks<'a, f32>,
    s: Chunks<'a, f32>,
    isum: Chunks<'a, i32>,
    g: usize,
    kern: &'a Kernels,
}

/// One activation row's slots in a [`PreQuant`].
pub struct QuantRow<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    isum: &'a mut [i32],
    g: usize,
    kern: &'a Kernels,
}

impl QuantRow<'_> {
    /// Quantizes this row's values (`cols` of them).
    pub fn quantize(&mut self, x: &[f32]) {
        (self.kern.quantize32)(x, self.g, self.qs, self.d, self.s, self.isum)
    }
}

impl<'a> Rows<'a> for PreQuant<'a> {
    type Row = QuantRow<'a>;
    #[inline]
    fn count(&self) -> Option<usize> {
        self.qs.count()
    }
    #[inline]
    unsafe fn row(&self, i: usize) -> QuantRow<'a> {
        // SAFETY: the caller's contract, passed on to each slot array (all of the same row count).
        unsafe {
            QuantRow {
                qs: self.qs.row(i),
                d: self.d.row(i),
                s: self.s.row(i),
                isum: self.isum.row(i),
                g: self.g,
                kern: self.kern,
            }
        }
    }
}

/// `out[i*rows + j] = Σ_k x[i*cols + k] · W[j][k]` for `i` in `0..m` (`x`: m×cols row-major, `out`: m×rows).
pub fn matmul(w: &WeightMatrix, x: &[f32], m: usize, out: &mut [f32], scratch: &mut MatmulScratch) {
    matmul_multi(&[w], x, m, &mut [out], scratch);
}

/// Below this many weight bytes × activation rows a call runs on the calling thread: forking would cost more.
/// (Measured: one AVX-512 core streams ~20 GB/s of Q4_1 from L2, a fork/join costs ~1-3 µs, so splitting pays
/// from ~6 µs of work, ~128 KB.)
const PAR_MIN_WORK: usize = 128 * 1024;

/// Large matmuls leave this percent of their rows to small tasks that go to whichever thread is free, two per
/// thread, provided each gets at least [`BALANCE_MIN_TASK_ROWS`] rows (see [`matmul_multi_with`]).
const BALANCE_SHARE_PCT: usize = 10;
const BALANCE_TASKS_PER_THREAD: usize = 2;
/// Smaller tail tasks cost more than they balance: each starts without its first panels prefetched and may need
/// a one-panel tile (measured on SmolLM2's 576- to 3072-row matmuls, which got slower with them).
const BALANCE_MIN_TASK_ROWS: usize = 128;

/// Several matrices (same `cols`) applied to the same input: activations quantized once, one parallel region.
pub fn matmul_multi(ws: &[&WeightMatrix], x: &[f32], m: usize, outs: &mut [&mut [f32]], scratch: &mut MatmulScratch) {
    matmul_multi_with(kernels(), ws, x, m, outs, scratch)
}

/// [`matmul_multi`] with an explicit kernel table (from [`crate::dispatch::Isa::kernels`]): for benchmarks and
/// tests that compare levels within one process.
pub fn matmul_multi_with(
    kern: &Kernels,
    ws: &[&WeightMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(ws.len(), outs.len(), "matmul_multi: {} matrices, {} outputs", ws.len(), outs.len());
    if ws.is_empty() || m == 0 {
        return;
    }
    let cols = ws[0].cols;
    assert_eq!(x.len(), m * cols, "matmul: x has {} values, expected m·cols = {}·{}", x.len(), m, cols);
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(w.cols, cols, "matmul_multi: matrices differ in cols");
        assert_eq!(o.len(), m * w.rows, "matmul: out has {} values, expected m·rows = {}·{}", o.len(), m, w.rows);
    }
    let prequantized = scratch.pre.take() == Some((x.as_ptr() as usize, x.len(), cols));
    if ws.iter().any(|w| w.data.act_kind() == ActKind::B32) && !prequantized {
        scratch.quantize32(kern, x, m, cols);
    }
    if ws.iter().any(|w| w.data.act_kind() == ActKind::K) {
        scratch.quantize_k(kern, x, m, cols);
    }
    let group = scratch.precision.group();
    scratch.outs.clear();
    scratch.outs.extend(outs.iter_mut().map(|o| (o.as_mut_ptr() as usize, o.len())));

    let total_rows: usize = ws.iter().map(|w| w.rows).sum();
    let work: usize = ws.iter().map(|w| w.bytes()).sum::<usize>() * m;
    let threads = if work < PAR_MIN_WORK { 1 } else { parallel::threads().min(total_rows.div_ceil(4)).max(1) };
    // One large task per thread, and for a large matrix (an lm_head) a tail of small tasks that whichever thread
    // finishes first takes. The two halves of an even split do not finish together on this shared machine (on
    // SmolLM2's lm_head at 16 tokens one thread often idled for a sixth of the call); with the tail, that call
    // went from 1470-1574 to 1384-1427 µs on average (and 218 to 203 µs at one token), alternated in one process.
    //
    // A prompt (at least two of the level's task rows) is also cut along the activation rows, into chunks of
    // `task_rows`, each with one share of the weight rows per thread, all claimed one at a time: a thread that
    // the machine slows down (a shared host, other programs beside infer) takes fewer of them instead of holding
    // the other up at the end of the region. Every task runs the kernel's own loop over its chunks, so the
    // arithmetic and its order stay those of the even split (the same bits). Measured on Zen 1, SmolLM2 Q4_1
    // pp512 with a busy loop on one of the two cores: 131 → 152-160 t/s; on the quiet machine within the noise
    // (the caller waited for its helper 30 ms of 8.3 s of passes).
    let chunks = if threads > 1 && m >= 2 * kern.task_rows { m.div_ceil(kern.task_rows) } else { 1 };
    let tail_rows = total_rows * BALANCE_SHARE_PCT / 100;
    let n_small = BALANCE_TASKS_PER_THREAD * threads;
    let n_small = if chunks == 1 && threads > 1 && tail_rows / n_small >= BALANCE_MIN_TASK_ROWS { n_small } else { 0 };
    let (n_big, n_tasks) = (threads, threads + n_small);
    let big_rows = if n_small == 0 { total_rows } else { total_rows - tail_rows };

    let act32 = Act32 { qs: &scratch.qs, d: &scratch.d, s: &scratch.s, isum: &scratch.isum };
    let actk: &[BlockQ8K] = &scratch.k;
    let outs_raw: &[(usize, usize)] = &scratch.outs;

    let task = |i: usize| {
        // Task `i` is share `t` of the weight rows against chunk `c` of the activation rows.
        let (t, c) = (i % n_tasks, i / n_tasks);
        let acts = if chunks == 1 { 0..m } else { c * kern.task_rows..((c + 1) * kern.task_rows).min(m) };
        let (x, m, a0) = (&x[acts.start * cols..acts.end * cols], acts.len(), acts.start * group);
        let act32 = act32.rows_from(a0, cols / 32);
        let actk = actk.get(a0 * (cols / QK_K)..).unwrap_or_default();
        // Rows [lo, hi) of the concatenation of all matrices. Within each matrix the bounds are then rounded down
        // to whole panels (16 rows, which also keeps the 4-row tiles whole), except at the matrix's end: neighbouring
        // tasks round their shared bound the same way, so the ranges stay disjoint and cover every row.
        let cut = |t: usize| match t {
            _ if t >= n_tasks => total_rows,
            _ if t <= n_big => big_rows * t / n_big,
            _ => big_rows + tail_rows * (t - n_big) / n_small,
        };
        let (lo, hi) = (cut(t), cut(t + 1));
        let mut base = 0;
        for (i, w) in ws.iter().enumerate() {
            let local = |g: usize| {
                let r = g.clamp(base, base + w.rows) - base;
                if r == w.rows { r } else { r / PANEL_ROWS * PANEL_ROWS }
            };
            let (a, b) = (local(lo), local(hi));
            if a < b {
                let rows = a..b;
                let (ptr, len) = outs_raw[i];
                // SAFETY: `ptr/len` come from `outs[i]`, a live `&mut [f32]` borrowed for this whole call; tasks get
                // disjoint row ranges of the concatenated matrices, so within `outs[i]` each task writes only the
                // columns `rows` of its own, and nothing else touches `outs` until every task has finished.
                let sink = unsafe { OutSink::from_raw(ptr as *mut f32, len, w.rows, rows.clone()) };
                run_panel(kern, w, rows, x, m, act32, actk, group, &sink.rows_from(acts.start));
            }
            base += w.rows;
        }
    };
    if n_tasks * chunks == 1 {
        task(0);
    } else {
        parallel::for_each_index(n_tasks * chunks, task);
    }
}

#[allow(clippy::too_many_arguments)]
fn run_panel(
    k: &Kernels,
    w: &WeightMatrix,
    rows: std::ops::Range<usize>,
    x: &[f32],
    m: usize,
    act32: Act32<'_>,
    actk: &[BlockQ8K],
    group: usize,
    out: &OutSink<'_>,
) {
    let n_act = m * group;
    let nb32 = w.cols / 32;
    let nbk = w.cols / QK_K;
    match w.data {
        WData::F32(d) => (k.f32)(d, w.cols, rows, x, m, out),
        WData::F16(d) => (k.f16)(d, w.cols, rows, x, m, out),
        WData::Q8_0(d) => (k.q8_0)(d, nb32, rows, act32, n_act, group, out),
        WData::Q4_0(d) => (k.q4_0)(d, nb32, rows, act32, n_act, group, out),
        WData::Q4_1(d) => (k.q4_1)(d, nb32, rows, act32, n_act, group, out),
        WData::Q5_0(d) => (k.q5_0)(d, nb32, rows, act32, n_act, group, out),
        WData::Q2K(d) => (k.q2_k)(d, nbk, rows, actk, n_act, group, out),
        WData::Q4K(d) => (k.q4_k)(d, nbk, rows, actk, n_act, group, out),
        WData::Q6K(d) => (k.q6_k)(d, nbk, rows, actk, n_act, group, out),
        WData::Packed(v) => {
            assert!(rows.start.is_multiple_of(PANEL_ROWS) && rows.end.is_multiple_of(PANEL_ROWS));
            let panels = rows.start / PANEL_ROWS..rows.end / PANEL_ROWS;
            // A level without a panel kernel uses the reference (tests compare levels within one process).
            match (v.format.is_float(), k.packed, k.packed_f) {
                (false, Some(f), _) => f(v, panels, act32, n_act, group, out),
                (false, None, _) => crate::packed::panel_ref(v, panels, act32, n_act, group, out),
                (true, _, Some(f)) => f(v, panels, x, m, out),
                (true, _, None) => crate::packed::panel_ref_f(v, panels, x, m, out),
            }
        }
    }
}
