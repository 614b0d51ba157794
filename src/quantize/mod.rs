//! Converting a GGUF model to other tensor types: the engine of `infer quantize`.
//!
//! [`Quantizer::open`] checks the paths and the input and decides every tensor's type ([`policy`]); then
//! [`Quantizer::run`] streams the output tensor by tensor: each tensor is dequantized (or read in place, if it is
//! F32), quantized in parallel row ranges, and written before the next is read, so memory holds one tensor in two
//! forms at most, never the model twice. The output appears under its name only when complete
//! ([`GgufStreamWriter`]).
//!
//! The quantizer either rounds to the nearest level ([`Mode::Rtn`]: llama-quantize's bytes) or searches each
//! block's scale ([`Mode::Search`], the default), optionally weighting each column by the [`Importance`] that
//! [`calibrate()`] gathers by running the model over a text.

pub mod calibrate;
pub mod check;
pub mod gptq;
pub mod policy;
pub mod timeline;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use infer_kernels::GgmlType;
use infer_kernels::quant::{Method, cast_blocks, quantize_rows};
use rayon::prelude::*;

use crate::gguf::{GgufError, GgufFile, GgufStreamWriter, MetaValue, TensorLayout};

pub use calibrate::{Importance, Staged, calibrate, self_calibrate};
pub use policy::{Policy, Reason, TARGETS, TensorPlan, parse_target};

/// GGML's quantization version (`GGML_QNT_VERSION`), stored as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// How the block formats choose their scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Round to nearest: llama-quantize's exact bytes (without an importance matrix).
    Rtn,
    /// Search each block's scale (and minimum) for the least weighted squared error.
    Search,
}

/// Where the search's column weights come from.
#[derive(Clone, Copy)]
pub enum Weighting<'a> {
    /// Nothing gathered: the search weighs columns by the norm before each matrix (where there is one).
    Norms,
    /// Gathered before the run ([`calibrate()`]).
    Gathered(&'a Importance),
    /// Being gathered while the run goes on ([`self_calibrate`]): tensors are converted as their layer's
    /// statistics arrive (by layer, the output projection last) and written in place.
    Staged(&'a Staged),
}

/// What went wrong, naming the file, tensor or type.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("{}: is the input file; write the output to another path", .0.display())]
    SameFile(PathBuf),
    #[error(
        "{}: holds quantized tensors ({types}); pass --allow-requantize to dequantize them first (the output then carries both quantizations' error)",
        path.display()
    )]
    NeedsRequantize { path: PathBuf, types: String },
    #[error("tensor '{name}': cannot convert from type {ty}: not supported")]
    Unsupported { name: String, ty: GgmlType },
    #[error("tensor '{name}': {cause}")]
    Quantize { name: String, cause: infer_kernels::quant::QuantizeError },
    #[error("interrupted; no output was written")]
    Cancelled,
    // Displayed, not chained: `GgufError::Io` already prints its cause.
    #[error("{0}")]
    Gguf(GgufError),
}

impl From<GgufError> for QuantizeError {
    fn from(e: GgufError) -> Self {
        QuantizeError::Gguf(e)
    }
}

/// The output file while it is being written: created by [`Quantizer::create_output`] (so that an unwritable
/// path fails before any work), filled by [`Quantizer::run`].
pub struct Output {
    path: PathBuf,
    writer: GgufStreamWriter,
}

/// A planned conversion of one file.
pub struct Quantizer {
    /// Shared with the model that calibration runs ([`Quantizer::shared_input`]), so the file is mapped once.
    input: Arc<GgufFile>,
    plan: Vec<TensorPlan>,
    mode: Mode,
}

/// One tensor converted (and handed to the writer), for progress reports.
#[derive(Debug, Clone)]
pub struct TensorDone<'a> {
    /// 0-based position in the file.
    pub index: usize,
    pub total: usize,
    pub plan: &'a TensorPlan,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Time to convert it (its writing overlaps the next tensor's conversion).
    pub elapsed: Duration,
}

/// Sizes before and after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub tensors: usize,
    pub elements: u64,
    pub file_bytes_in: u64,
    pub file_bytes_out: u64,
    pub tensor_bytes_in: u64,
    pub tensor_bytes_out: u64,
    pub elapsed: Duration,
}

impl Summary {
    /// Bits per weight of the input's tensor data.
    pub fn bpw_in(&self) -> f64 {
        bits_per_weight(self.tensor_bytes_in, self.elements)
    }

    /// Bits per weight of the output's tensor data.
    pub fn bpw_out(&self) -> f64 {
        bits_per_weight(self.tensor_bytes_out, self.elements)
    }
}

/// Bits per weight of `bytes` of tensor data holding `elements` values (0 for none).
pub fn bits_per_weight(bytes: u64, elements: u64) -> f64 {
    if elements == 0 { 0.0 } else { bytes as f64 * 8.0 / elements as f64 }
}

/// Whether `a` and `b` name the same file (`b` need not exist: then its folder is compared).
fn same_file(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| -> Option<PathBuf> {
        p.canonicalize().ok().or_else(|| {
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            Some(parent.canonicalize().ok()?.join(p.file_name()?))
        })
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b))
            && (ma.dev(), ma.ino()) == (mb.dev(), mb.ino())
        {
            return true;
        }
    }
    matches!((canon(a), canon(b)), (Some(x), Some(y)) if x == y)
}

impl Quantizer {
    /// Opens `input`, checks that `output` is another file and that quantized input is allowed, and plans every
    /// tensor's type.
    pub fn open(
        input: &Path,
        output: &Path,
        policy: &Policy,
        mode: Mode,
        allow_requantize: bool,
    ) -> Result<Quantizer, QuantizeError> {
        if same_file(input, output) {
            return Err(QuantizeError::SameFile(output.to_path_buf()));
        }
        let file = GgufFile::open(input)?;
        let plan = policy.plan(file.tensors());
        for p in &plan {
            if p.reason != Reason::Copied && !p.from.is_supported() {
                return Err(QuantizeError::Unsupported { name: p.name.clone(), ty: p.from });
            }
        }
        let q = Quantizer { input: Arc::new(file), plan, mode };
        let requant = q.requantized_types();
        if !requant.is_empty() && !allow_requantize {
            let types = requant.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ");
            return Err(QuantizeError::NeedsRequantize { path: input.to_path_buf(), types });
        }
        Ok(q)
    }

    pub fn input(&self) -> &GgufFile {
        &self.input
    }

    /// The input file, to build the calibration's model on the same mapping (one set of page-table entries to
    /// fault in and tear down instead of two: about 0.1 s of the 540 MB SmolLM2 f32's time).
    pub fn shared_input(&self) -> Arc<GgufFile> {
        self.input.clone()
    }

    pub fn plan(&self) -> &[TensorPlan] {
        &self.plan
    }

    /// Whether any tensor will be searched (in [`Mode::Search`]), so that importance would matter.
    pub fn searches(&self) -> bool {
        use GgmlType::*;
        self.plan.iter().any(|p| p.from != p.to && matches!(p.to, Q4_0 | Q4_1 | Q5_0 | Q2_K | Q4_K | Q6_K))
    }

    /// The quantized types among the input's tensors (which must be dequantized first).
    pub fn requantized_types(&self) -> Vec<GgmlType> {
        let set: BTreeSet<u32> = self
            .plan
            .iter()
            .filter(|p| p.reason != Reason::Copied && !matches!(p.from, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
            .map(|p| p.from.id())
            .collect();
        set.into_iter().filter_map(|id| GgmlType::from_id(id).ok()).collect()
    }

    /// The tensors whose rows did not fit their type, grouped as (wanted, written, count).
    pub fn fallbacks(&self) -> Vec<(GgmlType, GgmlType, usize)> {
        let mut groups: Vec<(GgmlType, GgmlType, usize)> = Vec::new();
        for p in self.plan.iter().filter(|p| p.fell_back()) {
            match groups.iter_mut().find(|g| (g.0, g.1) == (p.wanted, p.to)) {
                Some(g) => g.2 += 1,
                None => groups.push((p.wanted, p.to, 1)),
            }
        }
        groups
    }

    /// Creates the output's temporary file and writes its header (metadata with `general.file_type` and
    /// `general.quantization_version` set, and the planned tensor types). Dropping the result removes the file.
    pub fn create_output(&self, output: &Path) -> Result<Output, QuantizeError> {
        let mut metadata = self.input.metadata().clone();
        let target = self.plan.iter().filter(|p| p.reason == Reason::Target).map(|p| p.to).next();
        let main_type = target.or_else(|| self.plan.iter().find(|p| p.dims.len() > 1).map(|p| p.to));
        metadata.set("general.file_type", MetaValue::U32(policy::file_type(main_type.unwrap_or(GgmlType::F32))));
        metadata.set("general.quantization_version", MetaValue::U32(QUANTIZATION_VERSION));
        let layout =
            self.plan.iter().map(|p| TensorLayout { name: p.name.clone(), dims: p.dims.clone(), ty: p.to }).collect();
        Ok(Output { path: output.to_path_buf(), writer: GgufStreamWriter::create(output, &metadata, layout)? })
    }

    /// Writes every tensor into `output` and renames it into place, on `pool`'s threads. `weighting` weights the
    /// search; `cancel` is polled between row ranges, and setting it leaves no output; `on_tensor` hears of each
    /// tensor converted.
    ///
    /// Tensors are converted in slabs of rows, and a writer thread writes each slab while the pool converts the
    /// next, so that neither the pool's threads nor the disk wait on each other; at most [`BUFFERS`] converted
    /// slabs are in memory at once. With [`Weighting::Staged`], call this from outside `pool`: this thread waits
    /// between tensors for the calibration, which may need `pool`'s threads meanwhile.
    pub fn run(
        &self,
        pool: &rayon::ThreadPool,
        output: Output,
        weighting: Weighting<'_>,
        cancel: &AtomicBool,
        on_tensor: &mut (dyn FnMut(&TensorDone) + Send),
    ) -> Result<Summary, QuantizeError> {
        let start = Instant::now();
        let Output { path, writer } = output;
        let mut summary = Summary {
            tensors: self.plan.len(),
            elements: 0,
            file_bytes_in: self.input.file_len(),
            file_bytes_out: 0,
            tensor_bytes_in: 0,
            tensor_bytes_out: 0,
            elapsed: Duration::ZERO,
        };
        // The order of conversion: the file's, or (staged) each tensor as soon as its statistics can be there.
        let mut order: Vec<usize> = (0..self.plan.len()).collect();
        if let Weighting::Staged(staged) = weighting {
            order.sort_by_key(|&i| {
                let p = &self.plan[i];
                if p.from == p.to { 0 } else { staged.stage(&p.name) }
            });
        }
        let (to_writer, writer_rx) = mpsc::sync_channel::<Piece<'_>>(1);
        let (recycle, spare) = mpsc::channel::<Vec<u8>>();
        for _ in 0..BUFFERS {
            let _ = recycle.send(Vec::new());
        }
        let input = &*self.input;
        let (converted, written) = std::thread::scope(|scope| {
            let writing = scope.spawn(move || -> Result<GgufStreamWriter, GgufError> {
                let mut writer = writer;
                let mut unsynced = 0;
                for Piece { tensor, offset, chunk, done_with } in writer_rx {
                    let bytes = match &chunk {
                        Chunk::Borrowed(bytes) => bytes,
                        Chunk::Owned(buf, n) => &buf[..*n],
                    };
                    writer.write_at(tensor, offset, bytes)?;
                    timeline::mark!("wrote {} bytes of tensor {tensor}", bytes.len());
                    unsynced += bytes.len();
                    if let Chunk::Owned(buf, _) = chunk {
                        // The converter may have finished and dropped its end: then the buffer is just freed.
                        let _ = recycle.send(buf);
                    }
                    // Input nothing reads again leaves the process's page tables here, beside the conversion,
                    // rather than all at once when the map is dropped at the end: that took ~25 ms of SmolLM2's f32
                    // (540 MB) after the output was complete, with both threads otherwise idle.
                    input.release(done_with);
                    // The disk takes the file as it grows, while the converter works, rather than all at the end
                    // (finish's fsync was ~0.03-0.05 s of SmolLM2's q4_0 run, with both threads idle).
                    if unsynced >= SYNC_EVERY {
                        writer.sync_data()?;
                        timeline::mark!("synced");
                        unsynced = 0;
                    }
                }
                Ok(writer)
            });
            let (order, summary, sender) = (&order, &mut summary, &to_writer);
            let mut convert =
                move || self.convert_all(pool, order, weighting, cancel, on_tensor, summary, sender, &spare);
            // Staged, this thread waits on the calibration, which needs the pool's threads; otherwise it may as well
            // be one of them.
            let converted = if matches!(weighting, Weighting::Staged(_)) { convert() } else { pool.install(convert) };
            drop(to_writer);
            timeline::mark!("converted all");
            let written = writing.join();
            timeline::mark!("writer done");
            (converted, written)
        });
        // A failed write stops the converter (its channel closes), so the writer's error is the one to report.
        let writer = match written {
            Ok(w) => w?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        converted?;
        if cancel.load(Ordering::Relaxed) {
            return Err(QuantizeError::Cancelled);
        }
        writer.finish()?;
        timeline::mark!("finished (synced, renamed)");
        summary.file_bytes_out = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        summary.elapsed = start.elapsed();
        Ok(summary)
    }

    /// Converts the planned tensors in `order` and hands their bytes to the writer thread (`to_writer`), taking
    /// output buffers from `spare`. Returns early, without error, if the writer has stopped (it reports why).
    #[allow(clippy::too_many_arguments)]
    fn convert_all<'a>(
        &'a self,
        pool: &rayon::ThreadPool,
        order: &[usize],
        weighting: Weighting<'_>,
        cancel: &AtomicBool,
        on_tensor: &mut (dyn FnMut(&TensorDone) + Send),
        summary: &mut Summary,
        to_writer: &mpsc::SyncSender<Piece<'a>>,
        spare: &mpsc::Receiver<Vec<u8>>,
    ) -> Result<(), QuantizeError> {
        let mut x = Vec::<f32>::new();
        for &i in order {
            let p = &self.plan[i];
            if cancel.load(Ordering::Relaxed) {
                return Err(QuantizeError::Cancelled);
            }
            let t0 = Instant::now();
            let info = &self.input.tensors()[p.index];
            let data = self.input.tensor_data(info);
            // `data`'s place in the map, for releasing it once converted.
            let start = (self.input.data_offset() + info.offset) as usize;
            let range = start..start + data.len();
            let bytes_out = if p.from == p.to {
                // Already of its type (as llama-quantize, which also copies these): requantizing values that lie
                // on the type's grid could only lose.
                let piece = Piece { tensor: i, offset: 0, chunk: Chunk::Borrowed(data), done_with: range.clone() };
                if to_writer.send(piece).is_err() {
                    return Ok(());
                }
                data.len() as u64
            } else {
                let ne0 = info.ne0();
                let gathered: Option<std::borrow::Cow<'_, [f32]>> = match weighting {
                    Weighting::Norms => None,
                    Weighting::Gathered(m) => m.get(&p.name).map(|v| v.as_slice().into()),
                    Weighting::Staged(s) => {
                        timeline::mark!("waiting for {}", p.name);
                        s.wait(&p.name).map(Into::into)
                    }
                };
                let imp = match gathered.filter(|v| v.len() as u64 == ne0) {
                    Some(v) => Some(v),
                    None if self.mode == Mode::Search => self.norm_importance(&p.name).map(Into::into),
                    None => None,
                }
                .filter(|v| v.len() as u64 == ne0);
                // Read in place (F32), each slab's input is done with once that slab is converted; dequantized, the
                // whole tensor's is, once in `x`.
                let (values, in_place) = match (p.from, cast_blocks::<f32>(data)) {
                    (GgmlType::F32, Some(v)) => (v, true),
                    _ => {
                        let n = info.n_elements as usize;
                        resize(&mut x, n);
                        pool.install(|| dequantize_par(p, data, ne0 as usize, &mut x[..n]))?;
                        (&x[..n], false)
                    }
                };
                // Error feedback where the calibration gathered the input's Gram matrix (Q4_0 only).
                let factor = match weighting {
                    Weighting::Gathered(m) => m.factor(&p.name),
                    _ => None,
                }
                .filter(|_| self.mode == Mode::Search && p.to == GgmlType::Q4_0 && imp.is_some());
                let imp = imp.as_deref();
                // In slabs of rows, each written while the next is converted: the last tensor's writing is then
                // mostly done when its conversion ends.
                let row_len = ne0 as usize;
                let row_bytes = p.to.row_bytes(ne0).expect("planned types fit the rows") as usize;
                let slab_rows = (SLAB_VALUES / row_len.max(1)).max(1);
                let mut offset = 0;
                let mut read = 0;
                for slab in values.chunks(slab_rows * row_len) {
                    let n_out = slab.len() / row_len.max(1) * row_bytes;
                    // Every buffer is out with the writer until it has written one: wait for it (or for its end).
                    let Ok(mut out) = spare.recv() else { return Ok(()) };
                    resize(&mut out, n_out);
                    pool.install(|| self.quantize_par(p, slab, row_len, imp, factor, &mut out[..n_out], cancel))?;
                    let done_with = match (in_place, offset) {
                        (true, _) => start + read..start + read + std::mem::size_of_val(slab),
                        (false, 0) => range.clone(),
                        (false, _) => 0..0,
                    };
                    read += std::mem::size_of_val(slab);
                    let piece = Piece { tensor: i, offset, chunk: Chunk::Owned(out, n_out), done_with };
                    if to_writer.send(piece).is_err() {
                        return Ok(());
                    }
                    offset += n_out as u64;
                }
                offset
            };
            timeline::mark!("converted {}", p.name);
            summary.elements += info.n_elements;
            summary.tensor_bytes_in += data.len() as u64;
            summary.tensor_bytes_out += bytes_out;
            on_tensor(&TensorDone {
                index: p.index,
                total: self.plan.len(),
                plan: p,
                bytes_in: data.len() as u64,
                bytes_out,
                elapsed: t0.elapsed(),
            });
        }
        Ok(())
    }

    /// A data-free importance for a matrix whose input is a normalised hidden state: the square of the norm's
    /// weights, which scale each input column (an RMS-normalised vector has columns of similar size before them).
    fn norm_importance(&self, name: &str) -> Option<Vec<f32>> {
        let tied = self.input.tensor_info("output.weight").is_none();
        let norm = if name == "output.weight" || (tied && name == "token_embd.weight") {
            "output_norm.weight".to_string()
        } else {
            let (layer, matrix) = name.strip_prefix("blk.")?.split_once('.')?;
            match matrix {
                "attn_q.weight" | "attn_k.weight" | "attn_v.weight" => format!("blk.{layer}.attn_norm.weight"),
                "ffn_gate.weight" | "ffn_up.weight" => format!("blk.{layer}.ffn_norm.weight"),
                _ => return None,
            }
        };
        let info = self.input.tensor_info(&norm)?;
        let mut g = vec![0f32; info.n_elements as usize];
        infer_kernels::dequantize(info.ty, self.input.tensor_data(info), &mut g).ok()?;
        Some(g.iter().map(|v| v * v + 1e-6).collect())
    }

    /// Quantizes `x` (rows of `row_len`) into `out` in parallel row ranges; with `factor` (and `importance`), Q4_0
    /// with error feedback ([`gptq`]).
    #[allow(clippy::too_many_arguments)]
    fn quantize_par(
        &self,
        p: &TensorPlan,
        x: &[f32],
        row_len: usize,
        importance: Option<&[f32]>,
        factor: Option<&gptq::Factor>,
        out: &mut [u8],
        cancel: &AtomicBool,
    ) -> Result<(), QuantizeError> {
        let rows = ROWS_PER_TASK.div_ceil(row_len).max(1);
        let out_row = out.len() / (x.len() / row_len.max(1)).max(1);
        if let (Some(f), Some(imp)) = (factor, importance) {
            return x.par_chunks(rows * row_len).zip(out.par_chunks_mut(rows * out_row)).try_for_each(|(xc, oc)| {
                if cancel.load(Ordering::Relaxed) {
                    return Err(QuantizeError::Cancelled);
                }
                gptq::quantize_q4_0_rows(xc, f, imp, oc);
                Ok(())
            });
        }
        let method = match self.mode {
            Mode::Rtn => Method::Rtn,
            Mode::Search => Method::Search { importance },
        };
        x.par_chunks(rows * row_len).zip(out.par_chunks_mut(rows * out_row)).try_for_each(|(xc, oc)| {
            if cancel.load(Ordering::Relaxed) {
                return Err(QuantizeError::Cancelled);
            }
            quantize_rows(p.to, xc, row_len, oc, method)
                .map_err(|cause| QuantizeError::Quantize { name: p.name.clone(), cause })
        })
    }
}

/// Output buffers (of a slab each): one being filled, one queued for the writer, one being written, and a few
/// more to cover the writer's syncs.
const BUFFERS: usize = 6;

/// Values converted per slab: 1-4 MB of output for the 4-16-bit types (SmolLM2's 28 M-value embedding is 14
/// slabs), so that the last slab's writing is a small tail.
const SLAB_VALUES: usize = 1 << 21;

/// Bytes the writer writes between two syncs: what finish's fsync may still have to write, after the last
/// conversion. SmolLM2's tied embedding, converted last, is 16 MB of q4_0: at 16 MB it was all left to that fsync.
const SYNC_EVERY: usize = 4 << 20;

/// Part of a tensor on its way to the writer thread: `chunk` goes at byte `offset` of tensor `tensor`'s data, and
/// then the input's bytes `done_with` (offsets into the file) are not needed any more.
struct Piece<'a> {
    tensor: usize,
    offset: u64,
    chunk: Chunk<'a>,
    done_with: std::ops::Range<usize>,
}

/// Bytes for the writer: straight from the input, or the first `n` bytes of a converted buffer (which goes back to
/// the converter once written).
enum Chunk<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>, usize),
}

/// Values per parallel task: small enough to spread a 576×576 matrix over two threads, large enough that a task
/// outweighs its scheduling.
const ROWS_PER_TASK: usize = 1 << 15;

fn resize<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Dequantizes a tensor's bytes into `x` (exactly its values) in parallel row ranges.
fn dequantize_par(p: &TensorPlan, data: &[u8], row_len: usize, x: &mut [f32]) -> Result<(), QuantizeError> {
    let n = x.len();
    let row_bytes = data.len() / (n / row_len.max(1)).max(1);
    let rows = ROWS_PER_TASK.div_ceil(row_len).max(1);
    x.par_chunks_mut(rows * row_len).zip(data.par_chunks(rows * row_bytes)).try_for_each(|(xc, dc)| {
        infer_kernels::dequantize(p.from, dc, xc)
            .map_err(|_| QuantizeError::Unsupported { name: p.name.clone(), ty: p.from })
    })
}
