//! The model's tensors, looked up by name with their expected shapes and types checked once at load.
//!
//! Matrices stay in the memory map: a [`Linear`] records where a weight matrix lies and how it is encoded, and
//! hands the kernels a zero-copy view per call. When the CPU's kernel level has a panel kernel, the matrices it
//! can hold are repacked once at load into 16-row panels ([`infer_kernels::packed`]) and the kernels read those
//! instead; the memory map then only serves embedding lookups. Small vectors (norm weights) are copied out as f32.

use std::ops::Range;
use std::sync::Arc;

use infer_kernels::GgmlType;
use infer_kernels::matmul::WeightMatrix;
use infer_kernels::packed::{self, PackedMatrix};

use crate::gguf::{GgufError, GgufFile, TensorInfo};

use super::config::ModelConfig;

/// A weight matrix of `rows` output features × `cols` inputs, stored row-major in the file in format `ty`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    bytes: Range<usize>,
    /// The same weights in panels, when the kernels have a panel form for them.
    packed: Option<Arc<PackedMatrix>>,
    /// BF16 weights widened to f32 at load (exactly: BF16 is the top half of an f32), as the kernels have no BF16
    /// matrix product.
    widened: Option<Arc<Vec<f32>>>,
}

impl Linear {
    /// The kernel view of this matrix: its panels if it was repacked, else zero-copy inside `file` (the file it
    /// was loaded from).
    pub fn matrix<'a>(&'a self, file: &'a GgufFile) -> WeightMatrix<'a> {
        if let Some(p) = &self.packed {
            return WeightMatrix::packed(p);
        }
        if let Some(w) = &self.widened {
            let bytes = infer_kernels::quant::blocks_as_bytes(w.as_slice());
            return WeightMatrix::new(GgmlType::F32, bytes, self.rows, self.cols).expect("shape checked at load");
        }
        let data = &file_bytes(file)[self.bytes.clone()];
        WeightMatrix::new(self.ty, data, self.rows, self.cols).expect("shape checked at load")
    }

    /// Whether the kernel level has a panel kernel for this matrix's format.
    fn packable(&self) -> bool {
        let has_kernel = |f| infer_kernels::dispatch::kernels().packed_formats.contains(&f);
        packed::PackedFormat::for_type(self.ty).is_some_and(has_kernel)
    }

    /// Rows `r` of this matrix as a matrix of their own (a fused matrix's part: phi3's `attn_qkv`), still zero-copy
    /// in the file. Call before [`ModelWeights::pack`].
    fn rows_of(&self, r: Range<usize>) -> Linear {
        let row_len = self.bytes.len() / self.rows;
        let start = self.bytes.start + r.start * row_len;
        Linear {
            name: self.name.clone(),
            ty: self.ty,
            rows: r.len(),
            cols: self.cols,
            bytes: start..start + r.len() * row_len,
            packed: None,
            widened: self.widened.as_ref().map(|w| Arc::new(w[r.start * self.cols..r.end * self.cols].to_vec())),
        }
    }

    /// The raw bytes of row `r` (for embedding lookups).
    pub fn row_bytes<'a>(&self, file: &'a GgufFile, r: usize) -> &'a [u8] {
        let row_len = self.bytes.len() / self.rows;
        let start = self.bytes.start + r * row_len;
        &file_bytes(file)[start..start + row_len]
    }
}

fn file_bytes(file: &GgufFile) -> &[u8] {
    file.raw_bytes()
}

/// One decoder layer's weights. Shapes in (rows, cols) = (outputs, inputs).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,              // (n_embd)
    pub wq: Linear,                       // (n_head·head_dim, n_embd)
    pub wk: Linear,                       // (n_head_kv·head_dim, n_embd)
    pub wv: Linear,                       // (n_head_kv·head_dim_v, n_embd)
    pub wo: Linear,                       // (n_embd, n_head·head_dim_v)
    pub bq: Option<Vec<f32>>,             // (n_head·head_dim), qwen2
    pub bk: Option<Vec<f32>>,             // (n_head_kv·head_dim), qwen2
    pub bv: Option<Vec<f32>>,             // (n_head_kv·head_dim_v), qwen2
    pub q_norm: Option<Vec<f32>>,         // (head_dim), gemma3
    pub k_norm: Option<Vec<f32>>,         // (head_dim), gemma3
    pub attn_post_norm: Option<Vec<f32>>, // (n_embd), gemma3
    pub ffn_norm: Vec<f32>,               // (n_embd)
    pub ffn: Ffn,
    pub ffn_post_norm: Option<Vec<f32>>, // (n_embd), gemma3
}

/// A layer's feed-forward block.
#[derive(Debug, Clone)]
pub enum Ffn {
    /// `down(act(gate·x) ⊙ up·x)`: gate and up (n_ff, n_embd), down (n_embd, n_ff).
    Dense { gate: Linear, up: Linear, down: Linear },
    /// A mixture of experts (qwen3moe).
    Experts(Experts),
}

/// Experts' matrices, one [`Linear`] per expert, each a zero-copy slice of the file's 3-D `ffn_*_exps` tensor, so
/// a matrix product with one reads that expert's rows and nothing else.
#[derive(Debug, Clone)]
pub struct Experts {
    pub router: Linear,    // (n_expert, n_embd), `ffn_gate_inp`
    pub gate: Vec<Linear>, // per expert (n_ff_exp, n_embd)
    pub up: Vec<Linear>,   // per expert (n_ff_exp, n_embd)
    pub down: Vec<Linear>, // per expert (n_embd, n_ff_exp)
}

/// All of the model's weights.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub token_embd: Linear, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // (n_embd)
    /// The output projection: `output.weight`, or the token embedding when the model ties them.
    pub output: Linear, // (n_vocab, n_embd)
    /// Per-frequency divisors of the rotary angles (`rope_freqs.weight`, Llama 3.1's rope scaling), n_rot/2.
    pub rope_freqs: Option<Vec<f32>>,
}

impl ModelWeights {
    /// Looks up every tensor the decoder consumes, checking its shape and type; then refuses the file if it holds a
    /// tensor the decoder did not ask for, since ignoring a weight (a `rope_freqs.weight`, an attention bias, a
    /// variant's extra norm) would quietly give wrong text. Which tensors an architecture consumes is therefore
    /// defined in one place, by what this function looks up for its configuration.
    pub fn load(file: &GgufFile, c: &ModelConfig) -> Result<ModelWeights, GgufError> {
        let mut w = ModelWeights::load_unpacked(file, c)?;
        crate::timeline::mark!("tensors looked up");
        w.pack(file);
        crate::timeline::mark!("matrices packed");
        Ok(w)
    }

    /// [`ModelWeights::load`] without repacking: every matrix stays in its GGUF layout in the map. For a pass
    /// over a few tokens, where repacking would cost more than it saves, and where the caller goes on reading the
    /// file's pages (which repacking releases).
    pub fn load_unpacked(file: &GgufFile, c: &ModelConfig) -> Result<ModelWeights, GgufError> {
        let t = Consumed::new(file);
        let token_embd = linear(&t, "token_embd.weight", c.n_vocab, c.n_embd)?;
        let output = match t.optional("output.weight") {
            Some(_) => linear(&t, "output.weight", c.n_vocab, c.n_embd)?,
            None => token_embd.clone(),
        };
        let output_norm = vector(&t, "output_norm.weight", c.n_embd)?;
        let rope_freqs = match t.optional("rope_freqs.weight") {
            Some(_) => Some(vector(&t, "rope_freqs.weight", c.n_rot / 2)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let opt_vec = |s: &str, len: usize, wanted: bool| -> Result<Option<Vec<f32>>, GgufError> {
                if wanted { vector(&t, &n(s), len).map(Some) } else { Ok(None) }
            };
            let bias = |s: &str, len: usize| -> Result<Option<Vec<f32>>, GgufError> {
                if c.qkv_bias { vector(&t, &format!("blk.{il}.{s}.bias"), len).map(Some) } else { Ok(None) }
            };
            let (q, k, v) = (c.q_dim(), c.k_dim(), c.v_dim());
            let (wq, wk, wv) = if c.fused_qkv {
                let qkv = linear(&t, &n("attn_qkv"), q + k + v, c.n_embd)?;
                (qkv.rows_of(0..q), qkv.rows_of(q..q + k), qkv.rows_of(q + k..q + k + v))
            } else {
                (
                    linear(&t, &n("attn_q"), q, c.n_embd)?,
                    linear(&t, &n("attn_k"), k, c.n_embd)?,
                    linear(&t, &n("attn_v"), v, c.n_embd)?,
                )
            };
            let ffn = if let Some(m) = &c.moe {
                // 3-D tensors (n_expert matrices stacked): expert e owns rows e·rows..(e+1)·rows.
                let split = |s: &str, rows: usize, cols: usize| -> Result<Vec<Linear>, GgufError> {
                    let all = linear_stack(&t, &n(s), m.n_expert, rows, cols)?;
                    Ok((0..m.n_expert).map(|e| all.rows_of(e * rows..(e + 1) * rows)).collect())
                };
                Ffn::Experts(Experts {
                    router: linear(&t, &n("ffn_gate_inp"), m.n_expert, c.n_embd)?,
                    gate: split("ffn_gate_exps", m.n_ff, c.n_embd)?,
                    up: split("ffn_up_exps", m.n_ff, c.n_embd)?,
                    down: split("ffn_down_exps", c.n_embd, m.n_ff)?,
                })
            } else if c.fused_gate_up {
                let gate_up = linear(&t, &n("ffn_up"), 2 * c.n_ff, c.n_embd)?;
                let down = linear(&t, &n("ffn_down"), c.n_embd, c.n_ff)?;
                Ffn::Dense { gate: gate_up.rows_of(0..c.n_ff), up: gate_up.rows_of(c.n_ff..2 * c.n_ff), down }
            } else {
                Ffn::Dense {
                    gate: linear(&t, &n("ffn_gate"), c.n_ff, c.n_embd)?,
                    up: linear(&t, &n("ffn_up"), c.n_ff, c.n_embd)?,
                    down: linear(&t, &n("ffn_down"), c.n_embd, c.n_ff)?,
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(&t, &n("attn_norm"), c.n_embd)?,
                wq,
                wk,
                wv,
                wo: linear(&t, &n("attn_output"), c.n_embd, c.n_head * c.head_dim_v)?,
                bq: bias("attn_q", q)?,
                bk: bias("attn_k", k)?,
                bv: bias("attn_v", v)?,
                q_norm: opt_vec("attn_q_norm", c.head_dim, c.qk_norm)?,
                k_norm: opt_vec("attn_k_norm", c.head_dim, c.qk_norm)?,
                attn_post_norm: opt_vec("post_attention_norm", c.n_embd, c.post_norms)?,
                ffn_norm: vector(&t, &n("ffn_norm"), c.n_embd)?,
                ffn,
                ffn_post_norm: opt_vec("post_ffw_norm", c.n_embd, c.post_norms)?,
            });
        }
        t.all_consumed(c.arch.name())?;
        Ok(ModelWeights { token_embd, layers, output_norm, output, rope_freqs })
    }

    /// Multiply-adds of the layers' matrix products per token, each token through `experts_used` experts where
    /// the model has them, without the output head: what a prompt token costs when only the last token's logits
    /// are wanted (as in `bench`'s pp tests). Attention's own products are not counted.
    pub fn layer_macs(&self, experts_used: usize) -> u64 {
        let macs = |l: &Linear| (l.rows * l.cols) as u64;
        self.layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    Ffn::Dense { gate, up, down } => macs(gate) + macs(up) + macs(down),
                    Ffn::Experts(x) => {
                        let one = x.gate.first().map_or(0, |g| macs(g) + macs(&x.up[0]) + macs(&x.down[0]));
                        macs(&x.router) + one * experts_used as u64
                    }
                };
                macs(&l.wq) + macs(&l.wk) + macs(&l.wv) + macs(&l.wo) + ffn
            })
            .sum()
    }

    /// Bytes of the weights held outside the file's map: panels, and BF16 matrices widened to f32.
    pub fn owned_bytes(&self) -> usize {
        let mut all: Vec<&Linear> = vec![&self.token_embd, &self.output];
        for l in &self.layers {
            all.extend([&l.wq, &l.wk, &l.wv, &l.wo]);
            match &l.ffn {
                Ffn::Dense { gate, up, down } => all.extend([gate, up, down]),
                Ffn::Experts(x) => {
                    all.push(&x.router);
                    all.extend(x.gate.iter().chain(&x.up).chain(&x.down));
                }
            }
        }
        let own =
            |l: &Linear| l.packed.as_ref().map_or(0, |p| p.bytes()) + l.widened.as_ref().map_or(0, |w| w.len() * 4);
        // A tied output shares the embedding's widened matrix (an `Arc`), so count each allocation once.
        let mut seen = std::collections::HashSet::new();
        all.into_iter()
            .filter(|l| {
                let id = (
                    l.packed.as_ref().map(|p| Arc::as_ptr(p) as usize),
                    l.widened.as_ref().map(|w| Arc::as_ptr(w) as usize),
                );
                seen.insert(id) || id == (None, None)
            })
            .map(own)
            .sum()
    }

    /// Repacks every matrix the kernels read (not the token embedding, which is only looked up by row, unless it
    /// doubles as the output projection: then `output` gets its own panels), all into one buffer (see
    /// [`packed::pack_all`]).
    fn pack(&mut self, file: &GgufFile) {
        let mut all: Vec<&mut Linear> = vec![&mut self.output];
        for l in &mut self.layers {
            all.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]);
            match &mut l.ffn {
                Ffn::Dense { gate, up, down } => all.extend([gate, up, down]),
                Ffn::Experts(x) => {
                    all.push(&mut x.router);
                    all.extend(x.gate.iter_mut().chain(&mut x.up).chain(&mut x.down));
                }
            }
        }
        all.retain(|l| l.packable());
        let jobs: Vec<packed::PackJob<'_>> = all
            .iter()
            .map(|l| packed::PackJob { ty: l.ty, data: &file_bytes(file)[l.bytes.clone()], rows: l.rows, cols: l.cols })
            .collect();
        // The kernels read the panels from now on: the map's pages of a matrix would be a second resident copy, so
        // each part is let go as soon as it is packed (a tied token embedding's rows are still looked up in the
        // map, and fault back in one by one). If a matrix turns out not to be packable, its pages fault back in
        // from the file when the kernels read them.
        let starts: Vec<usize> = all.iter().map(|l| l.bytes.start).collect();
        let release = |j: usize, r: Range<usize>| file.release(starts[j] + r.start..starts[j] + r.end);
        let packed = packed::pack_all(&jobs, release);
        for (l, p) in all.into_iter().zip(packed) {
            l.packed = p.map(Arc::new);
        }
    }
}

fn check_shape(t: &TensorInfo, expected: &[u64]) -> Result<(), GgufError> {
    if t.dims != expected {
        return Err(GgufError::WrongShape { name: t.name.clone(), expected: expected.to_vec(), found: t.dims.clone() });
    }
    Ok(())
}

/// The file's tensors, remembering which ones the loader looked up.
struct Consumed<'a> {
    file: &'a GgufFile,
    used: std::cell::RefCell<Vec<bool>>,
}

impl<'a> Consumed<'a> {
    fn new(file: &'a GgufFile) -> Consumed<'a> {
        Consumed { file, used: std::cell::RefCell::new(vec![false; file.tensors().len()]) }
    }

    fn mark(&self, name: &str) -> Option<&'a TensorInfo> {
        let i = self.file.tensor_index(name)?;
        if let Some(u) = self.used.borrow_mut().get_mut(i) {
            *u = true;
        }
        self.file.tensors().get(i)
    }

    /// A tensor the decoder needs, or an error naming it.
    fn required(&self, name: &str) -> Result<&'a TensorInfo, GgufError> {
        self.mark(name).ok_or_else(|| GgufError::MissingTensor { name: name.to_string() })
    }

    /// A tensor the decoder uses when present.
    fn optional(&self, name: &str) -> Option<&'a TensorInfo> {
        self.mark(name)
    }

    /// Fails on the first tensor nobody looked up.
    fn all_consumed(&self, arch: &str) -> Result<(), GgufError> {
        let used = self.used.borrow();
        match self.file.tensors().iter().zip(used.iter()).find(|(_, u)| !**u) {
            Some((t, _)) => Err(GgufError::UnusedTensor { name: t.name.clone(), arch: arch.to_string() }),
            None => Ok(()),
        }
    }
}

/// A matrix tensor of ggml shape `[cols, rows]` whose type the kernels support.
fn linear(t: &Consumed<'_>, name: &str, rows: usize, cols: usize) -> Result<Linear, GgufError> {
    linear_dims(t, name, &[cols as u64, rows as u64], rows)
}

/// `n` matrices of `rows × cols` stacked in one tensor of ggml shape `[cols, rows, n]`, as one matrix of
/// `n·rows` rows.
fn linear_stack(t: &Consumed<'_>, name: &str, n: usize, rows: usize, cols: usize) -> Result<Linear, GgufError> {
    linear_dims(t, name, &[cols as u64, rows as u64, n as u64], n * rows)
}

fn linear_dims(t: &Consumed<'_>, name: &str, dims: &[u64], rows: usize) -> Result<Linear, GgufError> {
    let cols = dims[0] as usize;
    let info = t.required(name)?;
    check_shape(info, dims)?;
    if !info.ty.is_supported() || info.ty == GgmlType::Q8_K {
        return Err(GgufError::UnsupportedType { name: name.to_string(), ty: info.ty });
    }
    // BF16 matrices are widened to f32 once at load (exact), since the kernels have no BF16 path.
    let widened = if info.ty == GgmlType::BF16 {
        let mut w = vec![0f32; rows * cols];
        infer_kernels::dequant::dequantize(info.ty, t.file.tensor_data(info), &mut w)
            .map_err(|_| GgufError::UnsupportedType { name: name.to_string(), ty: info.ty })?;
        Some(Arc::new(w))
    } else {
        None
    };
    let start = (t.file.data_offset() + info.offset) as usize;
    if widened.is_some() {
        // Nothing reads the BF16 bytes again.
        t.file.release(start..start + info.n_bytes as usize);
    }
    Ok(Linear {
        name: name.to_string(),
        ty: info.ty,
        rows,
        cols,
        bytes: start..start + info.n_bytes as usize,
        packed: None,
        widened,
    })
}

/// A 1-D tensor of `len` values, converted to f32.
fn vector(t: &Consumed<'_>, name: &str, len: usize) -> Result<Vec<f32>, GgufError> {
    let info = t.required(name)?;
    check_shape(info, &[len as u64])?;
    let mut out = vec![0f32; len];
    infer_kernels::dequant::dequantize(info.ty, t.file.tensor_data(info), &mut out)
        .map_err(|_| GgufError::UnsupportedType { name: name.to_string(), ty: info.ty })?;
    if out.iter().any(|v| !v.is_finite()) {
        return Err(GgufError::ValueOutOfRange {
            key: name.to_string(),
            value: "non-finite".into(),
            why: "norm weights must be finite".into(),
        });
    }
    Ok(out)
}
