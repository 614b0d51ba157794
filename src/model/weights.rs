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
use rayon::prelude::*;

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

    /// Repacks the matrix into panels if the kernel level and the format allow it.
    fn pack(&mut self, file: &GgufFile) {
        if infer_kernels::dispatch::kernels().packed.is_none() {
            return;
        }
        let data = &file_bytes(file)[self.bytes.clone()];
        self.packed = packed::pack(self.ty, data, self.rows, self.cols).map(Arc::new);
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
    pub q_norm: Option<Vec<f32>>,         // (head_dim), gemma3
    pub k_norm: Option<Vec<f32>>,         // (head_dim), gemma3
    pub attn_post_norm: Option<Vec<f32>>, // (n_embd), gemma3
    pub ffn_norm: Vec<f32>,               // (n_embd)
    pub ffn_gate: Linear,                 // (n_ff, n_embd)
    pub ffn_up: Linear,                   // (n_ff, n_embd)
    pub ffn_down: Linear,                 // (n_embd, n_ff)
    pub ffn_post_norm: Option<Vec<f32>>,  // (n_embd), gemma3
}

/// All of the model's weights.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub token_embd: Linear, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // (n_embd)
    /// The output projection: `output.weight`, or the token embedding when the model ties them.
    pub output: Linear, // (n_vocab, n_embd)
}

impl ModelWeights {
    /// Looks up every tensor the decoder consumes, checking its shape and type; then refuses the file if it holds a
    /// tensor the decoder did not ask for, since ignoring a weight (a `rope_freqs.weight`, an attention bias, a
    /// variant's extra norm) would quietly give wrong text. Which tensors an architecture consumes is therefore
    /// defined in one place, by what this function looks up for its configuration.
    pub fn load(file: &GgufFile, c: &ModelConfig) -> Result<ModelWeights, GgufError> {
        let t = Consumed::new(file);
        let token_embd = linear(&t, "token_embd.weight", c.n_vocab, c.n_embd)?;
        let output = match t.optional("output.weight") {
            Some(_) => linear(&t, "output.weight", c.n_vocab, c.n_embd)?,
            None => token_embd.clone(),
        };
        let output_norm = vector(&t, "output_norm.weight", c.n_embd)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let opt_vec = |s: &str, len: usize, wanted: bool| -> Result<Option<Vec<f32>>, GgufError> {
                if wanted { vector(&t, &n(s), len).map(Some) } else { Ok(None) }
            };
            layers.push(LayerWeights {
                attn_norm: vector(&t, &n("attn_norm"), c.n_embd)?,
                wq: linear(&t, &n("attn_q"), c.q_dim(), c.n_embd)?,
                wk: linear(&t, &n("attn_k"), c.k_dim(), c.n_embd)?,
                wv: linear(&t, &n("attn_v"), c.v_dim(), c.n_embd)?,
                wo: linear(&t, &n("attn_output"), c.n_embd, c.n_head * c.head_dim_v)?,
                q_norm: opt_vec("attn_q_norm", c.head_dim, c.qk_norm)?,
                k_norm: opt_vec("attn_k_norm", c.head_dim, c.qk_norm)?,
                attn_post_norm: opt_vec("post_attention_norm", c.n_embd, c.post_norms)?,
                ffn_norm: vector(&t, &n("ffn_norm"), c.n_embd)?,
                ffn_gate: linear(&t, &n("ffn_gate"), c.n_ff, c.n_embd)?,
                ffn_up: linear(&t, &n("ffn_up"), c.n_ff, c.n_embd)?,
                ffn_down: linear(&t, &n("ffn_down"), c.n_embd, c.n_ff)?,
                ffn_post_norm: opt_vec("post_ffw_norm", c.n_embd, c.post_norms)?,
            });
        }
        t.all_consumed(c.arch.name())?;
        let mut w = ModelWeights { token_embd, layers, output_norm, output };
        w.pack(file);
        Ok(w)
    }

    /// Repacks every matrix the kernels read (not the token embedding, which is only looked up by row, unless it
    /// doubles as the output projection: then `output` gets its own panels).
    fn pack(&mut self, file: &GgufFile) {
        let mut all: Vec<&mut Linear> = vec![&mut self.output];
        for l in &mut self.layers {
            all.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.ffn_gate, &mut l.ffn_up, &mut l.ffn_down]);
        }
        all.par_iter_mut().for_each(|l| l.pack(file));
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
    let info = t.required(name)?;
    check_shape(info, &[cols as u64, rows as u64])?;
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
