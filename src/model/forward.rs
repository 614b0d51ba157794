//! The shared decoder forward pass: one function runs prefill, single-token decode and batched decode.
//!
//! A call takes a batch of sequences, each at its own position with its own KV block table, and a slice of new
//! tokens per sequence. All tokens of all sequences are stacked into one activation matrix, so every weight matrix
//! is read once per call whatever the batch holds: a long prompt (prefill), one token each for many users
//! (batched decode), or a mix (continuous batching). Only attention looks at sequences separately. Logits are
//! computed only for the positions that ask for them.

use std::ops::Range;
use std::sync::Arc;

use infer_kernels::matmul::{ActPrecision, MatmulScratch, PreQuant, WeightMatrix, matmul, matmul_multi};
use infer_kernels::parallel::{self, Chunks, DistinctIndices, Picked, Rows, for_each_row, for_each_row_in};
use infer_kernels::vec_f32;

use crate::gguf::{GgufError, GgufFile};

use super::config::{Activation, ModelConfig};
use super::kv_cache::{KvElem, KvError, KvPool, KvRow, Q8_BLOCK, Q8Tiles, SeqKv, TilesMut};
use super::ops;
use super::stats::{ActivationStats, Site};
use super::weights::{Experts, Ffn, LayerWeights, Linear, ModelWeights};

/// A loaded model: configuration, weights (zero-copy in the file's memory map) and the file itself.
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    file: Arc<GgufFile>,
    precision: ActPrecision,
    /// Rotary frequencies for the full-attention base and, if any layer uses it, the sliding-window base.
    rope_freqs: [Vec<f64>; 2],
}

/// Which positions of a sequence's new tokens need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One sequence's part of a batch.
pub struct SeqStep<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut SeqKv,
    pub logits: Logits,
}

/// Why a forward pass could not run.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("token id {token} is out of range (vocabulary has {n_vocab} tokens)")]
    InvalidToken { token: u32, n_vocab: usize },
    #[error(transparent)]
    Kv(#[from] KvError),
}

/// One of a token's chosen experts and its weight.
#[derive(Debug, Clone, Copy)]
struct Route {
    token: usize,
    expert: usize,
    weight: f32,
}

/// Where token `t` of the stacked batch comes from.
#[derive(Debug, Clone, Copy)]
struct TokenSlot {
    item: usize,
    pos: usize,
    token: u32,
}

/// Buffers reused across forward passes: grown to the largest batch seen, never shrunk, so the decode loop does
/// not allocate.
pub struct ForwardScratch {
    plan: Vec<TokenSlot>,
    kv_tiles: Vec<usize>, // per token: the KV tile (of its layer's group) and lane its new position goes to
    kv_lanes: Vec<usize>,
    x: Vec<f32>,             // (T, n_embd) residual stream
    xb: Vec<f32>,            // (T, n_embd) normed input of a block
    xb2: Vec<f32>,           // (T, n_embd) block output
    q: Vec<f32>,             // (T, n_head·head_dim)
    k: Vec<f32>,             // (T, n_head_kv·head_dim)
    v: Vec<f32>,             // (T, n_head_kv·head_dim_v)
    att: Vec<f32>,           // (T, n_head·head_dim_v)
    gate: Vec<f32>,          // (T, n_ff)
    up: Vec<f32>,            // (T, n_ff)
    rope_cos: [Vec<f32>; 2], // (T, n_rot/2) for the full and sliding-window bases
    rope_sin: [Vec<f32>; 2],
    out_rows: Vec<usize>,           // stacked-batch rows whose logits are wanted
    out_items: Vec<(usize, usize)>, // per item: (first logits row, number of rows)
    out_x: Vec<f32>,                // (n_out, n_embd)
    logits: Vec<f32>,               // (n_out, n_vocab)
    attention: AttentionParts,
    router: Vec<f32>,   // (T, n_expert) router scores, then softmax weights
    routes: Vec<Route>, // (T·n_used) each token's chosen experts, then grouped by expert
    moe_x: Vec<f32>,    // (tokens of one expert, n_embd) gathered inputs
    moe_y: Vec<f32>,    // (tokens of one expert, n_embd) that expert's outputs
    /// Per layer and expert: how many times the last forward pass ran the expert's matrices (0 or 1).
    expert_reads: Vec<u32>,
    matmul: MatmulScratch,
    /// Matrix-input statistics, gathered while `Some` (see [`ForwardScratch::collect_stats`]).
    stats: Option<Box<ActivationStats>>,
}

fn grow(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

impl ForwardScratch {
    pub fn new(model: &Model) -> ForwardScratch {
        ForwardScratch {
            plan: Vec::new(),
            kv_tiles: Vec::new(),
            kv_lanes: Vec::new(),
            x: Vec::new(),
            xb: Vec::new(),
            xb2: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            att: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            rope_cos: [Vec::new(), Vec::new()],
            rope_sin: [Vec::new(), Vec::new()],
            out_rows: Vec::new(),
            out_items: Vec::new(),
            out_x: Vec::new(),
            logits: Vec::new(),
            attention: AttentionParts::default(),
            router: Vec::new(),
            routes: Vec::new(),
            moe_x: Vec::new(),
            moe_y: Vec::new(),
            expert_reads: vec![0; model.config.moe.map_or(0, |m| m.n_expert * model.config.n_layer)],
            matmul: MatmulScratch::new(model.precision),
            stats: None,
        }
    }

    /// Starts gathering the statistics of every matrix's input (llama-imatrix's: the sum of each column's square)
    /// over the tokens of the following forward passes, for calibrated quantization; with `gram`, each input's
    /// whole Gram matrix too.
    pub fn collect_stats(&mut self, model: &Model, gram: bool) {
        self.stats = Some(Box::new(ActivationStats::new(&model.config, gram)));
    }

    /// The statistics being gathered, if [`collect_stats`](Self::collect_stats) was called (to attach a sink).
    pub fn stats_mut(&mut self) -> Option<&mut ActivationStats> {
        self.stats.as_deref_mut()
    }

    /// Stops gathering and returns what was gathered.
    pub fn take_stats(&mut self) -> Option<ActivationStats> {
        self.stats.take().map(|s| *s)
    }

    /// How many times the last forward pass read each expert's matrices, per layer (`n_layer × n_expert`, row-major;
    /// empty without experts). Grouping tokens by expert makes every entry 0 or 1.
    pub fn expert_reads(&self) -> &[u32] {
        &self.expert_reads
    }

    /// The logits of batch item `item` from the last forward pass: `rows × n_vocab` values, one row per position
    /// that asked for logits (the last one, or all), in position order.
    pub fn logits(&self, item: usize, n_vocab: usize) -> &[f32] {
        let (first, n) = self.out_items.get(item).copied().unwrap_or((0, 0));
        &self.logits[first * n_vocab..(first + n) * n_vocab]
    }
}

thread_local! {
    /// Attention's score rows, reused by every task on this thread.
    static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A span's outputs and states before they are merged into a token's row (whole-token attention tasks).
    static SPARE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A prompt tile's gathered queries, block scores, f32 copies of a key and a value block, and a span's
    /// outputs (see [`Model::attention_tiles`]).
    static TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A key block and a run of value rows of an 8-bit cache as f32, for a decode task (see [`SpanRun::span`]).
    static DEQUANT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The few-token attention tasks (token, run of heads, span) and their partial results (see
/// [`Model::attention`]), kept between forward passes.
#[derive(Default)]
pub(crate) struct AttentionParts {
    tasks: Vec<(u32, u32, u32)>,
    buf: Vec<f32>,
    /// Prompt tiles (first token, tokens) and each token's tile (see [`Model::attention_tiles`]).
    tiles: Vec<(u32, u32)>,
    tile_of: Vec<u32>,
}

/// Runs of few-token attention tasks per thread: enough to even out spans of different lengths.
const ATTENTION_TASKS_PER_THREAD: usize = 8;

/// Below this many rows, elementwise work runs on the calling thread: spreading a single token's few thousand
/// values over threads costs more than it saves.
const PAR_ROWS: usize = 16;

/// Row `t` of two matrices at once (`a` rows of `wa` values, `b` rows of `wb`, the same number of rows), in one
/// parallel region where [`for_rows`] would use one. With `quant`, each finished row of `b` is also quantized for
/// the matmul that reads it next (see [`MatmulScratch::prequantize`]), in the same pass.
fn for_rows2(
    a: &mut [f32],
    wa: usize,
    b: &mut [f32],
    wb: usize,
    quant: Option<PreQuant<'_>>,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    let par = a.len() / wa.max(1) >= PAR_ROWS;
    let rows = (Chunks::new(a, wa), Chunks::new(b, wb), quant);
    for_each_row(rows, par, |t, (ra, rb, qr)| {
        f(t, ra, rb);
        if let Some(mut qr) = qr {
            qr.quantize(rb);
        }
    });
}

/// Row `t` of a matrix (`width` values per row); with `quant`, each finished row is also quantized for the matmul
/// that reads it next.
fn for_rows(buf: &mut [f32], width: usize, quant: Option<PreQuant<'_>>, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let tasks = if buf.len() / width.max(1) >= PAR_ROWS { parallel::threads() } else { 1 };
    for_rows_in(buf, width, quant, tasks, f)
}

/// [`for_rows`] in `tasks` runs of rows (see [`for_each_row_in`]).
fn for_rows_in(
    buf: &mut [f32],
    width: usize,
    quant: Option<PreQuant<'_>>,
    tasks: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    for_each_row_in((Chunks::new(buf, width), quant), tasks, |t, (row, qr)| {
        f(t, row);
        if let Some(mut qr) = qr {
            qr.quantize(row);
        }
    });
}

/// Where each token's new position goes in a layer's KV tiles: see [`rotate_and_store`].
struct KvAt<'a> {
    tiles: &'a [usize],
    lanes: &'a [usize],
    /// Elements per key tile and per value tile.
    sizes: (usize, usize),
    bs: usize,
    /// Values per key head.
    v_head: usize,
}

/// Per token `t` (in parallel with enough tokens): `rotate(t, q row, k row)`, then the rotated key and the value
/// row go into the token's KV tiles. The tiles must all differ (one new position per sequence), which
/// [`DistinctIndices`] checks.
fn rotate_and_store(
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    tiles: TilesMut<'_>,
    at: &KvAt<'_>,
    rotate: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) {
    let picks = DistinctIndices::new(at.tiles);
    let (kn, vn) = at.sizes;
    match tiles {
        TilesMut::F32 { k: kt, v: vt } => {
            let tiles = (Picked::new(kt, kn, picks), Picked::new(vt, vn, picks));
            rotate_and_store_in(q, k, v, tiles, at, rotate, |(kt, vt), lane, kr, vr| {
                f32::store(kt, vt, lane, at.bs, kr, vr, at.v_head)
            })
        }
        TilesMut::F16 { k: kt, v: vt } => {
            let tiles = (Picked::new(kt, kn, picks), Picked::new(vt, vn, picks));
            rotate_and_store_in(q, k, v, tiles, at, rotate, |(kt, vt), lane, kr, vr| {
                half::f16::store(kt, vt, lane, at.bs, kr, vr, at.v_head)
            })
        }
        TilesMut::Q8 { k: kq, kd, v: vq, vd } => {
            let (kb, vb) = (kn / Q8_BLOCK, vn / Q8_BLOCK);
            let keys = (Picked::new(kq, kn, picks), Picked::new(kd, kb, picks));
            let values = (Picked::new(vq, vn, picks), Picked::new(vd, vb, picks));
            rotate_and_store_in(q, k, v, (keys, values), at, rotate, |((kq, kd), (vq, vd)), lane, kr, vr| {
                Q8Tiles { kq, kd, vq, vd }.store(lane, at.bs, kr, vr, at.v_head)
            })
        }
    }
}

/// [`rotate_and_store`] over one element type's tiles: `store(tiles, lane, key, value)` writes a token's row.
fn rotate_and_store_in<'a, P: Rows<'a>>(
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &[f32],
    tiles: P,
    at: &KvAt<'_>,
    rotate: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
    store: impl Fn(P::Row, usize, &[f32], &[f32]) + Sync,
) {
    let n = at.tiles.len();
    let (q_dim, k_dim, v_dim) = (q.len() / n.max(1), k.len() / n.max(1), v.len() / n.max(1));
    let rows = (Chunks::new(q, q_dim), Chunks::new(k, k_dim), tiles);
    for_each_row(rows, n >= PAR_ROWS, |t, (qr, kr, tiles)| {
        rotate(t, qr, kr);
        store(tiles, at.lanes[t], kr, &v[t * v_dim..(t + 1) * v_dim]);
    });
}

impl Model {
    /// Builds the model from an open file: configuration from metadata, then every tensor checked by name, shape
    /// and type.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Model, GgufError> {
        Model::build(file, ModelWeights::load)
    }

    /// [`Model::from_file`] with every matrix left in its GGUF layout (see [`ModelWeights::load_unpacked`]): for a
    /// short pass, such as `infer quantize`'s self-calibration over 47 tokens, which on an F32 input would
    /// otherwise repack the whole model first (measured on AVX-512: 0.89 s against 0.4 s for the whole quantize).
    pub fn from_file_unpacked(file: Arc<GgufFile>) -> Result<Model, GgufError> {
        Model::build(file, ModelWeights::load_unpacked)
    }

    fn build(
        file: Arc<GgufFile>,
        load: fn(&GgufFile, &ModelConfig) -> Result<ModelWeights, GgufError>,
    ) -> Result<Model, GgufError> {
        let config = ModelConfig::from_metadata(file.metadata())?;
        crate::timeline::mark!("configuration read");
        let weights = load(&file, &config)?;
        let mut rope_freqs = [
            ops::rope_freqs(config.n_rot, config.rope_base),
            if config.layer_is_swa.iter().any(|&s| s) {
                ops::rope_freqs(config.n_rot, config.rope_base_swa)
            } else {
                Vec::new()
            },
        ];
        if let Some(divisors) = &weights.rope_freqs {
            if let Some(bad) = divisors.iter().find(|d| !d.is_finite() || **d <= 0.0) {
                return Err(GgufError::ValueOutOfRange {
                    key: "rope_freqs.weight".into(),
                    value: bad.to_string(),
                    why: "rotary frequency divisors must be finite and > 0".into(),
                });
            }
            for freqs in &mut rope_freqs {
                freqs.iter_mut().zip(divisors).for_each(|(f, d)| *f /= *d as f64);
            }
        }
        Ok(Model { config, weights, file, precision: ActPrecision::Q8x2, rope_freqs })
    }

    /// Opens and loads a GGUF file.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Model, GgufError> {
        Model::from_file(Arc::new(GgufFile::open(path)?))
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn shared_file(&self) -> Arc<GgufFile> {
        self.file.clone()
    }

    /// How activations are quantized for the integer dot products (set before creating scratch buffers).
    pub fn set_precision(&mut self, precision: ActPrecision) {
        self.precision = precision;
    }

    pub fn precision(&self) -> ActPrecision {
        self.precision
    }

    fn mat<'a>(&'a self, l: &'a super::weights::Linear) -> WeightMatrix<'a> {
        l.matrix(&self.file)
    }

    /// A layer's query, key and value projections, which one matmul call runs together.
    fn qkv<'a>(&'a self, l: &'a LayerWeights) -> [WeightMatrix<'a>; 3] {
        [self.mat(&l.wq), self.mat(&l.wk), self.mat(&l.wv)]
    }

    /// Runs one batch through the decoder, appending the new tokens to each sequence's cache.
    ///
    /// The current rayon pool's threads stay together as one team for the whole pass (see
    /// [`parallel::with_team`]): its few hundred parallel regions are handed over without a fork/join each.
    pub fn forward(
        &self,
        items: &mut [SeqStep],
        pool: &mut KvPool,
        s: &mut ForwardScratch,
    ) -> Result<(), ForwardError> {
        parallel::with_team(|| self.forward_pass(items, pool, s))
    }

    fn forward_pass(
        &self,
        items: &mut [SeqStep],
        pool: &mut KvPool,
        s: &mut ForwardScratch,
    ) -> Result<(), ForwardError> {
        let c = &self.config;
        // Plan the stacked batch and validate every token before touching the cache.
        s.plan.clear();
        for (i, item) in items.iter().enumerate() {
            for (j, &token) in item.tokens.iter().enumerate() {
                if token as usize >= c.n_vocab {
                    return Err(ForwardError::InvalidToken { token, n_vocab: c.n_vocab });
                }
                s.plan.push(TokenSlot { item: i, pos: item.kv.len() + j, token });
            }
        }
        // A sequence that reserved blocks before a later one failed keeps them in its table for its next call.
        for item in items.iter_mut() {
            pool.reserve(item.kv, item.tokens.len())?;
        }
        let t_count = s.plan.len();
        if t_count == 0 {
            s.out_items.clear();
            s.out_items.resize(items.len(), (0, 0));
            return Ok(());
        }

        let (n_embd, q_dim, k_dim, v_dim, n_ff) = (c.n_embd, c.q_dim(), c.k_dim(), c.v_dim(), c.n_ff);
        let att_dim = c.n_head * c.head_dim_v;
        let half_rot = c.n_rot / 2;

        // Token embeddings.
        {
            let plan = &s.plan;
            let emb = &self.weights.token_embd;
            let file = &*self.file;
            let scale = c.embed_scale;
            for_rows(grow(&mut s.x, t_count * n_embd), n_embd, None, |t, row| {
                let bytes = emb.row_bytes(file, plan[t].token as usize);
                infer_kernels::dequant::dequantize(emb.ty, bytes, row).expect("row geometry checked at load");
                if let Some(sc) = scale {
                    row.iter_mut().for_each(|v| *v *= sc);
                }
            });
        }
        // Rotation tables per token, for the full-attention base and the sliding-window base.
        // (The sliding-window table only when a layer uses it.)
        for (b, freqs) in self.rope_freqs.iter().enumerate().filter(|(_, f)| !f.is_empty()) {
            let cos = grow(&mut s.rope_cos[b], t_count * half_rot.max(1));
            let sin = grow(&mut s.rope_sin[b], t_count * half_rot.max(1));
            for (t, slot) in s.plan.iter().enumerate() {
                let r = t * half_rot..(t + 1) * half_rot;
                ops::rope_table(slot.pos, freqs, c.rope_scale, &mut cos[r.clone()], &mut sin[r]);
            }
        }
        grow(&mut s.xb, t_count * n_embd);
        grow(&mut s.xb2, t_count * n_embd);
        grow(&mut s.q, t_count * q_dim);
        grow(&mut s.k, t_count * k_dim);
        grow(&mut s.v, t_count * v_dim);
        grow(&mut s.att, t_count * att_dim);
        grow(&mut s.gate, t_count * n_ff);
        grow(&mut s.up, t_count * n_ff);

        let one_token_each = items.iter().all(|i| i.tokens.len() == 1);
        // The first layer's input norm; every later one is fused with the residual that ends the layer before.
        if let Some(l0) = self.weights.layers.first() {
            let x = &s.x[..t_count * n_embd];
            let quant = s.matmul.prequantize(&self.qkv(l0).each_ref(), &s.xb[..t_count * n_embd], n_embd);
            for_rows(&mut s.xb[..t_count * n_embd], n_embd, quant, |t, row| {
                ops::rmsnorm(row, &x[t * n_embd..(t + 1) * n_embd], &l0.attn_norm, c.rms_eps)
            });
        }
        for (il, lw) in self.weights.layers.iter().enumerate() {
            // Q, K, V from one pass over the normed input.
            {
                let mut outs: [&mut [f32]; 3] =
                    [&mut s.q[..t_count * q_dim], &mut s.k[..t_count * k_dim], &mut s.v[..t_count * v_dim]];
                let qkv = self.qkv(lw);
                if let Some(st) = &mut s.stats {
                    st.add(il, Site::AttnIn, &s.xb[..t_count * n_embd]);
                }
                matmul_multi(&qkv.each_ref(), &s.xb[..t_count * n_embd], t_count, &mut outs, &mut s.matmul);
                for (out, bias) in outs.iter_mut().zip([&lw.bq, &lw.bk, &lw.bv]) {
                    if let Some(b) = bias {
                        for_rows(out, b.len(), None, |_, row| row.iter_mut().zip(b).for_each(|(x, bv)| *x += bv));
                    }
                }
            }

            // Per-head norms and rotations.
            let base_idx = usize::from(c.layer_is_swa[il]);
            {
                let (cos, sin) = (&s.rope_cos[base_idx], &s.rope_sin[base_idx]);
                let rotate = |heads: &mut [f32], t: usize, norm: Option<&Vec<f32>>| {
                    for head in heads.chunks_mut(c.head_dim) {
                        if let Some(w) = norm {
                            ops::rmsnorm_inplace(head, w, c.rms_eps);
                        }
                        let r = t * half_rot..(t + 1) * half_rot;
                        ops::rope_apply(head, c.n_rot, c.rope_style, &cos[r.clone()], &sin[r]);
                    }
                };
                let rotate = |t: usize, qr: &mut [f32], kr: &mut [f32]| {
                    rotate(qr, t, lw.q_norm.as_ref());
                    rotate(kr, t, lw.k_norm.as_ref());
                };
                let (q, k, v) = (&mut s.q[..t_count * q_dim], &mut s.k[..t_count * k_dim], &s.v[..t_count * v_dim]);
                if one_token_each {
                    // Decode: every new position lies in its own sequence's block, so each token's pass can also
                    // store its key and value, in parallel, on the thread that attends with them next. (Serially,
                    // the stores were a tenth of a millisecond per 16-token layer, mostly cache misses down the
                    // transposed key column, with the other threads idle.)
                    s.kv_tiles.clear();
                    s.kv_lanes.clear();
                    for slot in &s.plan {
                        let (tile, lane) = pool.tile_of(items[slot.item].kv, il, slot.pos);
                        s.kv_tiles.push(tile);
                        s.kv_lanes.push(lane);
                    }
                    let at = KvAt {
                        tiles: &s.kv_tiles,
                        lanes: &s.kv_lanes,
                        sizes: pool.tile_sizes(il),
                        bs: pool.block_size,
                        v_head: pool.v_head(il),
                    };
                    rotate_and_store(q, k, v, pool.tiles_mut(il), &at, rotate);
                } else {
                    for_rows2(q, q_dim, k, k_dim, None, |t, qr, kr| rotate(t, qr, kr));
                    // Cache the new keys and values (a prompt's positions share blocks: one writer).
                    for (t, slot) in s.plan.iter().enumerate() {
                        pool.write(
                            items[slot.item].kv,
                            il,
                            slot.pos,
                            &s.k[t * k_dim..(t + 1) * k_dim],
                            &s.v[t * v_dim..(t + 1) * v_dim],
                        );
                    }
                }
            }

            let wo = self.mat(&lw.wo);
            let att = &mut s.att[..t_count * att_dim];
            let q = &s.q[..t_count * q_dim];
            self.attention(il, items, pool, &s.plan, q, att, &wo, &mut s.matmul, &mut s.attention);

            // Output projection, optional post-norm, residual.
            if let Some(st) = &mut s.stats {
                st.add(il, Site::AttnOut, &s.att[..t_count * att_dim]);
            }
            matmul(&wo, &s.att[..t_count * att_dim], t_count, &mut s.xb2[..t_count * n_embd], &mut s.matmul);
            // Residual, then the feed-forward's input norm (quantized for its first matmul), in one pass.
            let xb = &s.xb[..t_count * n_embd];
            let quant = match &lw.ffn {
                Ffn::Dense { gate, up, .. } => s.matmul.prequantize(&[&self.mat(gate), &self.mat(up)], xb, n_embd),
                Ffn::Experts(x) => s.matmul.prequantize(&[&self.mat(&x.router)], xb, n_embd),
            };
            self.residual(
                &mut s.x[..t_count * n_embd],
                &s.xb2[..t_count * n_embd],
                lw.attn_post_norm.as_deref(),
                Some((lw.ffn_norm.as_slice(), &mut s.xb[..t_count * n_embd])),
                quant,
            );
            match &lw.ffn {
                Ffn::Dense { gate, up, down } => self.dense_ffn(il, [gate, up, down], t_count, s),
                Ffn::Experts(x) => self.experts_ffn(il, x, t_count, s),
            }
            // Residual, then the next layer's input norm (quantized for its first matmul).
            let next_layer = self.weights.layers.get(il + 1);
            let quant = next_layer
                .and_then(|l| s.matmul.prequantize(&self.qkv(l).each_ref(), &s.xb[..t_count * n_embd], n_embd));
            let next = next_layer.map(|l| (l.attn_norm.as_slice(), &mut s.xb[..t_count * n_embd]));
            let delta = &s.xb2[..t_count * n_embd];
            self.residual(&mut s.x[..t_count * n_embd], delta, lw.ffn_post_norm.as_deref(), next, quant);
        }

        // Logits, only where asked.
        s.out_rows.clear();
        s.out_items.clear();
        let mut t0 = 0;
        for item in items.iter() {
            let n = item.tokens.len();
            let first = s.out_rows.len();
            match item.logits {
                Logits::None => {}
                Logits::Last if n > 0 => s.out_rows.push(t0 + n - 1),
                Logits::Last => {}
                Logits::All => s.out_rows.extend(t0..t0 + n),
            }
            s.out_items.push((first, s.out_rows.len() - first));
            t0 += n;
        }
        if let Some(st) = &mut s.stats {
            // The output projection's input at every position, whether or not its logits are wanted (calibration
            // needs the statistics, not the logits).
            let out_x = grow(&mut s.out_x, t0 * n_embd);
            for (o, x) in out_x.chunks_exact_mut(n_embd).zip(s.x.chunks_exact(n_embd)).take(t0) {
                ops::rmsnorm(o, x, &self.weights.output_norm, c.rms_eps);
            }
            st.add_output(&out_x[..t0 * n_embd]);
        }
        let n_out = s.out_rows.len();
        if n_out > 0 {
            let out_x = grow(&mut s.out_x, n_out * n_embd);
            for (r, &t) in s.out_rows.iter().enumerate() {
                ops::rmsnorm(
                    &mut out_x[r * n_embd..(r + 1) * n_embd],
                    &s.x[t * n_embd..(t + 1) * n_embd],
                    &self.weights.output_norm,
                    c.rms_eps,
                );
            }
            let logits = grow(&mut s.logits, n_out * c.n_vocab);
            matmul(&self.mat(&self.weights.output), &s.out_x[..n_out * n_embd], n_out, logits, &mut s.matmul);
            if let Some(cap) = c.final_logit_softcap {
                ops::softcap(logits, cap);
            }
        }

        for item in items.iter_mut() {
            pool.advance(item.kv, item.tokens.len());
        }
        Ok(())
    }

    /// The feed-forward `xb2 = down(act(gate·xb) ⊙ up·xb)` for the batch's `t_count` rows.
    fn dense_ffn(&self, il: usize, [wg, wu, wd]: [&Linear; 3], t_count: usize, s: &mut ForwardScratch) {
        let (n_embd, n_ff) = (self.config.n_embd, self.config.n_ff);
        let (wg, wu, wd) = (self.mat(wg), self.mat(wu), self.mat(wd));
        {
            let mut outs: [&mut [f32]; 2] = [&mut s.gate[..t_count * n_ff], &mut s.up[..t_count * n_ff]];
            if let Some(st) = &mut s.stats {
                st.add(il, Site::FfnIn, &s.xb[..t_count * n_embd]);
            }
            matmul_multi(&[&wg, &wu], &s.xb[..t_count * n_embd], t_count, &mut outs, &mut s.matmul);
        }
        {
            let up = &s.up[..t_count * n_ff];
            let act = self.config.activation;
            let quant = s.matmul.prequantize(&[&wd], &s.gate[..t_count * n_ff], n_ff);
            for_rows(&mut s.gate[..t_count * n_ff], n_ff, quant, |t, g| {
                let u = &up[t * n_ff..(t + 1) * n_ff];
                match act {
                    Activation::Silu => ops::swiglu(g, u),
                    Activation::GeluTanh => ops::geglu(g, u),
                }
            });
        }
        if let Some(st) = &mut s.stats {
            st.add(il, Site::FfnDownIn, &s.gate[..t_count * n_ff]);
        }
        matmul(&wd, &s.gate[..t_count * n_ff], t_count, &mut s.xb2[..t_count * n_embd], &mut s.matmul);
    }

    /// The mixture of experts: each token's router picks its experts, then tokens are grouped by expert so that each
    /// chosen expert's three matrices are read once for all the tokens that chose it (and an expert nobody chose is
    /// not read at all); `xb2` gets each token's weighted sum of its experts' outputs.
    fn experts_ffn(&self, il: usize, x: &Experts, t_count: usize, s: &mut ForwardScratch) {
        let c = &self.config;
        let m = c.moe.expect("expert weights come with an expert configuration");
        let (n_embd, n_ff, n_expert, k) = (c.n_embd, m.n_ff, m.n_expert, m.n_used);
        let router = grow(&mut s.router, t_count * n_expert);
        matmul(&self.mat(&x.router), &s.xb[..t_count * n_embd], t_count, router, &mut s.matmul);
        // Per token: softmax over all experts, the top k (ties to the lower index), renormalised if asked.
        s.routes.clear();
        for t in 0..t_count {
            let row = &mut router[t * n_expert..(t + 1) * n_expert];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0.0;
            for v in row.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            let first = s.routes.len();
            for _ in 0..k {
                let best = (0..n_expert)
                    .filter(|e| !s.routes[first..].iter().any(|r| r.expert == *e))
                    .fold(None, |b: Option<usize>, e| if b.is_none_or(|b| row[e] > row[b]) { Some(e) } else { b })
                    .expect("k ≤ n_expert");
                s.routes.push(Route { token: t, expert: best, weight: row[best] / sum });
            }
            if m.norm_weights {
                let total: f32 = s.routes[first..].iter().map(|r| r.weight).sum();
                s.routes[first..].iter_mut().for_each(|r| r.weight /= total);
            }
        }
        // Group by expert, each expert's tokens in batch order (an unstable sort, which does not allocate).
        s.routes.sort_unstable_by_key(|r| (r.expert, r.token));
        let out = &mut s.xb2[..t_count * n_embd];
        out.fill(0.0);
        let reads = &mut s.expert_reads[il * n_expert..(il + 1) * n_expert];
        reads.fill(0);
        let mut i = 0;
        while i < s.routes.len() {
            let e = s.routes[i].expert;
            let group = s.routes[i..].iter().take_while(|r| r.expert == e).count();
            let rows = &s.routes[i..i + group];
            let xin = grow(&mut s.moe_x, group * n_embd);
            for (j, r) in rows.iter().enumerate() {
                xin[j * n_embd..(j + 1) * n_embd].copy_from_slice(&s.xb[r.token * n_embd..(r.token + 1) * n_embd]);
            }
            let (gate, up) = (grow(&mut s.gate, group * n_ff), grow(&mut s.up, group * n_ff));
            let (wg, wu, wd) = (self.mat(&x.gate[e]), self.mat(&x.up[e]), self.mat(&x.down[e]));
            matmul_multi(&[&wg, &wu], xin, group, &mut [&mut *gate, &mut *up], &mut s.matmul);
            for (g, u) in gate.chunks_exact_mut(n_ff).zip(up.chunks_exact(n_ff)) {
                ops::swiglu(g, u);
            }
            let y = grow(&mut s.moe_y, group * n_embd);
            matmul(&wd, gate, group, y, &mut s.matmul);
            for (r, yr) in rows.iter().zip(y.chunks_exact(n_embd)) {
                let o = &mut out[r.token * n_embd..(r.token + 1) * n_embd];
                o.iter_mut().zip(yr).for_each(|(o, y)| *o += r.weight * y);
            }
            reads[e] += 1;
            i += group;
        }
    }

    /// `x += norm(delta)` (or `x += delta` without a post-norm); with `then = (w, xb)`, also `xb = rmsnorm(x)·w`
    /// for the next block, in the same pass over the rows.
    fn residual(
        &self,
        x: &mut [f32],
        delta: &[f32],
        post_norm: Option<&[f32]>,
        then: Option<(&[f32], &mut [f32])>,
        quant: Option<PreQuant<'_>>,
    ) {
        let (n_embd, eps) = (self.config.n_embd, self.config.rms_eps);
        let d: &[f32] = delta;
        let add = |t: usize, row: &mut [f32]| {
            let dr = &d[t * n_embd..(t + 1) * n_embd];
            match post_norm {
                Some(w) => {
                    // Normalise and add in one pass: `delta` itself is never rewritten.
                    let inv = ops::inv_rms(dr, eps);
                    for ((xv, &dv), &g) in row.iter_mut().zip(dr).zip(w) {
                        *xv += dv * inv * g;
                    }
                }
                None => {
                    for (xv, &dv) in row.iter_mut().zip(dr) {
                        *xv += dv;
                    }
                }
            }
        };
        match then {
            Some((w, xb)) => for_rows2(x, n_embd, xb, n_embd, quant, |t, row, out| {
                add(t, row);
                ops::rmsnorm(out, row, w, eps);
            }),
            None => for_rows(x, n_embd, None, add),
        }
    }

    /// Causal attention of every new token over its sequence's cache (which already holds the new keys and values),
    /// with a streaming softmax over the cache's blocks. The positions are cut into spans of [`SPAN`] at fixed
    /// multiples of it: each span's softmax and weighted values are computed on their own, and the spans are
    /// merged in order ([`vec_f32::SoftmaxState::merge`]). A query head's arithmetic is therefore the same whoever
    /// computes it, so results do not depend on the batch, the split into tasks or the thread count.
    ///
    /// A prompt (more tokens than sequences, enough for every thread) goes by tiles of tokens
    /// ([`Model::attention_tiles`]), with the same arithmetic per token.
    ///
    /// With enough tokens for every thread, a task takes whole tokens (all their heads and spans) and also
    /// quantizes each finished row for the output projection `wo` (see [`MatmulScratch::prequantize`]), which then
    /// skips its own quantization pass. With fewer (decode), a task takes one span of one token's run of query
    /// heads that share a key head, so each key and value is read once for all of them and a long cache spreads
    /// over all threads; the spans' partial results are merged afterwards, and `wo` quantizes its few rows itself.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        il: usize,
        items: &[SeqStep],
        pool: &KvPool,
        plan: &[TokenSlot],
        q: &[f32],
        att: &mut [f32],
        wo: &WeightMatrix<'_>,
        mm: &mut MatmulScratch,
        parts: &mut AttentionParts,
    ) {
        let c = &self.config;
        let (hd, hdv, group) = (c.head_dim, c.head_dim_v, c.gqa_group());
        let window = pool.window(il);
        assert_eq!(pool.block_size, BS, "attention's score buffer is sized for the default block size");
        let threads = parallel::threads();
        let whole_tokens = plan.len() >= 4 * threads;
        // The positions token `t` sees.
        let seen = |t: usize| seen_by(window, plan[t].pos);
        // Query heads h0..h0 + heads of token t over the positions `range`, unnormalised.
        let span = |t: usize, h0: usize, heads: usize, range: Range<usize>, out: &mut [f32], st: &mut [_]| {
            let slot = plan[t];
            let qh = &q[t * c.q_dim() + h0 * hd..t * c.q_dim() + (h0 + heads) * hd];
            let n_kv = heads.div_ceil(group);
            let run = self.span_run(il, items[slot.item].kv, pool, h0 / group, n_kv);
            // A prompt's tokens read the same blocks one after another, which stay cached; a decoding token
            // reads its sequence's blocks once per step, from memory. A task over every key head reads each
            // block's keys and values as two contiguous runs, which the hardware prefetcher streams better alone
            // (see `SpanRun::span`); one over some of them skips through the block and asks for its share.
            let fetch = items[slot.item].tokens.len() == 1 && n_kv < c.n_head_kv;
            run.span(qh, range, fetch, out, st)
        };
        if whole_tokens && plan.len() > items.len() {
            self.attention_tiles(il, items, pool, plan, q, att, wo, mm, parts);
            return;
        }
        if whole_tokens {
            let heads = decode_heads(c.n_head, c.n_head_kv);
            let width = c.n_head * hdv;
            let quant = mm.prequantize(&[wo], att, width);
            // One new token per sequence here (prompts go to `attention_tiles`): one contiguous run of tokens per
            // thread, so the rows stay on the thread that reads them next (small runs interleaved them and cost 5%
            // of a 16-sequence step).
            for_rows_in(att, width, quant, threads, |t, row| {
                let mut spare = SPARE.take();
                spare.resize(heads * hdv, 0.0);
                for (r, out) in row.chunks_exact_mut(heads * hdv).enumerate() {
                    let h0 = r * heads;
                    let mut states = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
                    for (i, range) in spans(seen(t)).enumerate() {
                        if i == 0 {
                            span(t, h0, heads, range, out, &mut states[..heads]);
                        } else {
                            let (tmp, _) = spare.split_at_mut(heads * hdv);
                            let mut st = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
                            span(t, h0, heads, range, tmp, &mut st[..heads]);
                            merge_heads(out, &mut states[..heads], tmp, &st[..heads], hdv);
                        }
                    }
                    normalize(out, &states[..heads], hdv);
                }
                SPARE.set(spare);
            });
            return;
        }
        // Few tokens: one task per (token, run of heads, span). With enough spans, a run takes the heads of
        // several key heads (see `decode_heads`); otherwise the longest runs of heads sharing a key head that still
        // leave every thread a task (see `run_heads`).
        let span_count = |t: usize| spans(seen(t)).count();
        let total_spans: usize = (0..plan.len()).map(span_count).sum();
        let heads = if total_spans >= 2 * threads {
            decode_heads(c.n_head, c.n_head_kv)
        } else {
            run_heads(c.n_head, shared_heads(group), total_spans, threads)
        };
        let runs = c.n_head / heads;
        let tasks_for = |n: usize| if n >= 2 { n.min(threads * ATTENTION_TASKS_PER_THREAD) } else { 1 };
        if total_spans == plan.len() {
            // Every token sees a single span (a cache of up to SPAN positions): each (token, run) task's result is
            // final, so it goes straight into the token's row of `att`, normalised there, with the same arithmetic
            // as the merge below gives a lone span. No partial buffer and no serial merge pass, which the other
            // threads would spin through.
            let n = plan.len() * runs;
            for_each_row_in(Chunks::new(&mut att[..n * heads * hdv], heads * hdv), tasks_for(n), |i, out| {
                let (t, r) = (i / runs, i % runs);
                let mut states = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
                span(t, r * heads, heads, seen(t), out, &mut states[..heads]);
                normalize(out, &states[..heads], hdv);
            });
            return;
        }
        parts.tasks.clear();
        for t in 0..plan.len() {
            for r in 0..runs {
                parts.tasks.extend((0..span_count(t)).map(|i| (t as u32, r as u32, i as u32)));
            }
        }
        // Each task's part: its heads' unnormalised outputs, then their softmax states (max, sum).
        let part_len = heads * (hdv + 2);
        let n = parts.tasks.len();
        grow(&mut parts.buf, n * part_len);
        let tasks = &parts.tasks;
        for_each_row_in(Chunks::new(&mut parts.buf[..n * part_len], part_len), tasks_for(n), |i, part| {
            let (t, r, si) = (tasks[i].0 as usize, tasks[i].1 as usize, tasks[i].2 as usize);
            let range = spans(seen(t)).nth(si).expect("counted above");
            let (out, st) = part.split_at_mut(heads * hdv);
            let mut states = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
            span(t, r * heads, heads, range, out, &mut states[..heads]);
            for (h, s) in states[..heads].iter().enumerate() {
                st[2 * h] = s.max;
                st[2 * h + 1] = s.sum;
            }
        });
        // The spans of each (token, run) follow one another: merge them in order into the token's row.
        let mut i = 0;
        while i < n {
            let (t, r) = (tasks[i].0 as usize, tasks[i].1 as usize);
            let count = span_count(t);
            let out = &mut att[t * c.n_head * hdv + r * heads * hdv..t * c.n_head * hdv + (r + 1) * heads * hdv];
            let state_of = |part: &[f32], h: usize| vec_f32::SoftmaxState {
                max: part[heads * hdv + 2 * h],
                sum: part[heads * hdv + 2 * h + 1],
            };
            let first = &parts.buf[i * part_len..(i + 1) * part_len];
            out.copy_from_slice(&first[..heads * hdv]);
            let mut states = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
            for (h, st) in states[..heads].iter_mut().enumerate() {
                *st = state_of(first, h);
            }
            for j in i + 1..i + count {
                let part = &parts.buf[j * part_len..(j + 1) * part_len];
                let mut st = [vec_f32::SoftmaxState::EMPTY; MAX_TASK_HEADS];
                for (h, s) in st[..heads].iter_mut().enumerate() {
                    *s = state_of(part, h);
                }
                merge_heads(out, &mut states[..heads], &part[..heads * hdv], &st[..heads], hdv);
            }
            normalize(out, &states[..heads], hdv);
            i += count;
        }
    }

    /// Attention of layer `il`'s query heads that share key heads `kvh..kvh + n_kv`, over sequence `kv` (see
    /// [`SpanRun`]).
    fn span_run<'a>(&self, il: usize, kv: &'a SeqKv, pool: &'a KvPool, kvh: usize, n_kv: usize) -> SpanRun<'a> {
        let c = &self.config;
        SpanRun {
            il,
            kv,
            pool,
            kvh,
            n_kv,
            hd: c.head_dim,
            hdv: c.head_dim_v,
            scale: c.attn_scale,
            softcap: c.attn_softcap,
        }
    }

    /// Prompt attention in tiles: up to [`TILE_TOKENS`] consecutive tokens of one sequence × the query heads that
    /// share a key head form one task's query rows, and every key and value block of the positions they see is
    /// read (and for an f16 cache, converted to f32) once for all of them: the scores are a rows × 16 product per
    /// block and the values a rows × hdv one, where one token at a time reloaded and reconverted each block per
    /// token. See [`SpanRun::tile`] for why each row's arithmetic is exactly what [`SpanRun::span`] gives that
    /// token alone, so results still do not depend on the batch or the split.
    ///
    /// A task writes its rows to its own slot of `parts.buf`; a second pass copies them into the tokens' rows of
    /// `att` and quantizes each for the output projection `wo` there. A later tile costs more (its tokens see
    /// more positions): tasks go costliest first, one at a time, so the threads finish together.
    #[allow(clippy::too_many_arguments)]
    fn attention_tiles(
        &self,
        il: usize,
        items: &[SeqStep],
        pool: &KvPool,
        plan: &[TokenSlot],
        q: &[f32],
        att: &mut [f32],
        wo: &WeightMatrix<'_>,
        mm: &mut MatmulScratch,
        parts: &mut AttentionParts,
    ) {
        let c = &self.config;
        let (hd, hdv, group) = (c.head_dim, c.head_dim_v, c.gqa_group());
        let window = pool.window(il);
        let heads = shared_heads(group);
        let runs = c.n_head / heads;
        let tile_tokens = (TILE_ROWS / heads).clamp(1, TILE_TOKENS);
        // Tiles: runs of consecutive positions of one sequence.
        parts.tiles.clear();
        parts.tile_of.clear();
        let mut t = 0;
        while t < plan.len() {
            let mut e = t + 1;
            while e < plan.len()
                && e - t < tile_tokens
                && plan[e].item == plan[t].item
                && plan[e].pos == plan[e - 1].pos + 1
            {
                e += 1;
            }
            parts.tiles.push((t as u32, (e - t) as u32));
            t = e;
        }
        // Costliest first (the tiles that see the most positions), one task each: threads claim tasks in order,
        // so the cheap ones at the end even out the threads' loads.
        let cost = |&(t0, tn): &(u32, u32)| seen_by(window, plan[(t0 + tn - 1) as usize].pos).len();
        parts.tiles.sort_by_key(|tile| std::cmp::Reverse(cost(tile)));
        parts.tile_of.resize(plan.len(), 0);
        for (i, &(t0, tn)) in parts.tiles.iter().enumerate() {
            parts.tile_of[t0 as usize..(t0 + tn) as usize].fill(i as u32);
        }
        let slot = tile_tokens * heads * hdv;
        let n = parts.tiles.len() * runs;
        grow(&mut parts.buf, n * slot);
        let (tiles, tile_of) = (&parts.tiles, &parts.tile_of);
        for_each_row_in(Chunks::new(&mut parts.buf[..n * slot], slot), n, |i, out| {
            let (t0, tn) = (tiles[i / runs].0 as usize, tiles[i / runs].1 as usize);
            let h0 = (i % runs) * heads;
            let run = self.span_run(il, items[plan[t0].item].kv, pool, h0 / group, 1);
            let seen: [Range<usize>; TILE_TOKENS] =
                std::array::from_fn(|tt| if tt < tn { seen_by(window, plan[t0 + tt].pos) } else { 0..0 });
            let rows = tn * heads;
            let mut buf = TILE.take();
            buf.resize(rows * hd + SpanRun::tile_scratch(rows, hd, hdv), 0.0);
            let (qt, scratch) = buf.split_at_mut(rows * hd);
            for (tt, qr) in qt.chunks_exact_mut(heads * hd).enumerate() {
                let at = (t0 + tt) * c.q_dim() + h0 * hd;
                qr.copy_from_slice(&q[at..at + heads * hd]);
            }
            run.tile(qt, &seen[..tn], &mut out[..rows * hdv], scratch);
            TILE.set(buf);
        });
        let width = c.n_head * hdv;
        let quant = mm.prequantize(&[wo], att, width);
        let buf = &parts.buf;
        for_rows_in(att, width, quant, parallel::threads(), |t, row| {
            let tile = tile_of[t] as usize;
            let tt = t - tiles[tile].0 as usize;
            for (r, dst) in row.chunks_exact_mut(heads * hdv).enumerate() {
                let at = (tile * runs + r) * slot + tt * heads * hdv;
                dst.copy_from_slice(&buf[at..at + heads * hdv]);
            }
        });
    }
}

/// Most query heads one attention task takes (those sharing a key head).
const MAX_HEADS: usize = 8;

/// Most query heads one decode task takes: all the heads of several key heads (see [`decode_heads`]).
const MAX_TASK_HEADS: usize = 32;

/// Query heads per decode task: all those of as many key heads as fit in [`MAX_TASK_HEADS`] (all of a small
/// model's), so that the task reads each block's keys and values as two contiguous runs. Per key head, one task
/// skipped two thirds of every block of SmolLM2's cache, which defeated the hardware prefetcher: at 4,096 cached
/// positions a decode step took 16.6 ms with all nine heads per task against 34.9 ms with three (Zen 3, 2
/// threads, alternated in one process); the software prefetch that per-head tasks need made it slower (21 ms).
fn decode_heads(n_head: usize, n_head_kv: usize) -> usize {
    let group = n_head / n_head_kv;
    if group > MAX_TASK_HEADS {
        return shared_heads(group);
    }
    (1..=n_head_kv).rev().find(|k| n_head_kv.is_multiple_of(*k) && k * group <= MAX_TASK_HEADS).unwrap_or(1) * group
}

/// Query heads per few-token task when there are fewer than two spans per thread: the longest run out of the
/// `shared` heads of a key head (a divisor of it) that still gives every thread at least one task. Each head of a
/// run reads the same keys and values, so a run converts each f16 element once for all its heads; split into
/// single heads, Gemma 3 (four query heads on one key head) converted every element four times in its sliding-window
/// layers, whose 512 positions are two or three spans, and their attention cost about 1.7× the run's (perf, decode
/// at 1,024 positions, Zen 1: 16.7% of the samples against matmuls' 76.6% with single heads, 11.0% against 84.3%
/// with runs of four). Three spans of a window (a, 256 and 256 − a positions) still split evenly over two threads.
fn run_heads(n_head: usize, shared: usize, total_spans: usize, threads: usize) -> usize {
    (1..=shared).rev().find(|h| shared.is_multiple_of(*h) && total_spans * (n_head / h) >= threads).unwrap_or(1)
}

/// Query heads one attention task takes together: the most (up to [`MAX_HEADS`]) that divide the GQA `group`, so
/// that they share one key head and each key and value is read once for all of them.
fn shared_heads(group: usize) -> usize {
    (1..=MAX_HEADS.min(group)).rev().find(|h| group.is_multiple_of(*h)).unwrap_or(1)
}

/// Most tokens per prompt tile (see [`Model::attention_tiles`]).
const TILE_TOKENS: usize = 16;

/// Most query rows (tokens × heads) per prompt tile: their score rows for a chunk (up to 32 KB) and outputs stay in
/// L1 and L2 while the tile's blocks go past. Every tile reads all the blocks its tokens see, so at long contexts
/// (blocks from L3) larger tiles mean less traffic: at 4,096 positions, 64 rows (with `tile_span`'s prefetch) took
/// SmolLM2 Q4_0 pp512 from 242-263 t/s to 292-313 on a loaded host, measured alternately with 32 rows.
const TILE_ROWS: usize = 64;

/// The positions a token at `pos` sees, under an optional sliding window.
fn seen_by(window: Option<usize>, pos: usize) -> Range<usize> {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
}

/// Positions per attention span (see [`Model::attention`]): spans start at multiples of it, so a long cache
/// splits into independent pieces that threads share. A multiple of the KV block size.
const SPAN: usize = 256;

/// The spans covering positions `range`: cut at multiples of [`SPAN`].
fn spans(range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = range.end;
    let mut at = range.start;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let next = ((at / SPAN + 1) * SPAN).min(end);
            let r = at..next;
            at = next;
            r
        })
    })
}

/// Folds a later span's unnormalised outputs and softmax states into `out`/`states` (per head, `hdv` values
/// each). A factor of exactly 1 skips its multiply, so a span that does not raise the maximum leaves `out` as it
/// was before its own values are added.
fn merge_heads(
    out: &mut [f32],
    states: &mut [vec_f32::SoftmaxState],
    other: &[f32],
    st: &[vec_f32::SoftmaxState],
    hdv: usize,
) {
    for (h, (state, &o)) in states.iter_mut().zip(st).enumerate() {
        let (r_self, r_other) = state.merge(o);
        let (dst, src) = (&mut out[h * hdv..(h + 1) * hdv], &other[h * hdv..(h + 1) * hdv]);
        if r_self != 1.0 {
            vec_f32::scale(r_self, dst);
        }
        vec_f32::axpy(r_other, src, dst);
    }
}

/// Divides each head's weighted sum of values by its softmax sum.
fn normalize(out: &mut [f32], states: &[vec_f32::SoftmaxState], hdv: usize) {
    for (h, state) in states.iter().enumerate() {
        if state.sum > 0.0 {
            vec_f32::scale(1.0 / state.sum, &mut out[h * hdv..(h + 1) * hdv]);
        }
    }
}

/// Positions per attention block (a block of the KV cache).
const BS: usize = super::kv_cache::DEFAULT_BLOCK_SIZE;

/// Blocks per softmax step of [`SpanRun::span`] and [`SpanRun::tile`].
const CHUNK: usize = 8;

/// What one span of attention needs besides the query and the positions.
struct SpanRun<'a> {
    il: usize,
    kv: &'a SeqKv,
    pool: &'a KvPool,
    /// The task's first key (and value) head: its query heads share key heads `kvh..kvh + n_kv`, an equal number
    /// each, in order.
    kvh: usize,
    n_kv: usize,
    hd: usize,
    hdv: usize,
    scale: f32,
    /// Soft-capping of the scaled scores (gemma2).
    softcap: Option<f32>,
}

impl SpanRun<'_> {
    /// The unnormalised attention of the query heads `qh` (an equal run of them per key head `kvh..kvh + n_kv`)
    /// over positions `range`: `out` (heads × hdv) gets each head's weighted sum of values under its softmax state
    /// in `states`. Positions go in chunks of up to CHUNK blocks: their scores first (one row of CHUNK·BS per
    /// head), one softmax step per head over the whole chunk, then the values; per-block softmax steps of 16 scores
    /// were mostly overhead. Each head's arithmetic is the same whichever heads share its task. With `fetch`
    /// (decode over some of the key heads, which skips through each block), the task first asks for its key heads'
    /// share of every block of the span (at most [`SPAN`] positions: 64 KB on SmolLM2's f16 cache) into L2. Over
    /// all of them it reads each block's keys and values as two contiguous runs, which the hardware prefetcher
    /// streams faster without that (see [`decode_heads`]).
    ///
    /// Prefetch history: two blocks ahead into L1 took 16 sequences at 512-528 cached positions from 714-719 to
    /// 842-854 t/s, one at 1024-1056 from 145-160 to 185-200. At 4,096 positions that still waited on memory
    /// (perf: half of `span`'s own samples on the prefetches, which stall when the L1's miss buffers are full,
    /// and most of `dot_cols`/`axpy_rows` on their loads); the whole span into L2 at the start measured 2-6%
    /// faster per decode step, alternated token by token with the old scheme in one process (see the commit).
    fn span(
        &self,
        qh: &[f32],
        range: Range<usize>,
        fetch: bool,
        out: &mut [f32],
        states: &mut [vec_f32::SoftmaxState],
    ) {
        let (kvh, n_kv, hd, hdv) = (self.kvh, self.n_kv, self.hd, self.hdv);
        let heads = states.len();
        // Query heads per key head.
        let per_kv = heads / n_kv;
        debug_assert_eq!(per_kv * n_kv, heads, "whole groups of query heads per key head");
        let row = CHUNK * BS;
        // The score rows live in a per-thread buffer: a fresh zeroed array per task (4 KB) was most of the
        // attention tasks' fixed cost at short contexts. Only what a chunk writes is read back.
        let mut scores = SCORES.take();
        scores.resize(heads * row, 0.0);
        let mut tile = [0f32; MAX_TASK_HEADS * BS];
        let tile = &mut tile[..heads * BS];
        // f32 room for a key head's block or a block's value rows, where the cache is 8-bit.
        let mut dequant = DEQUANT.take();
        if matches!(self.pool.dtype, super::KvDtype::Q8_0) {
            dequant.resize(BS * hd.max(hdv), 0.0);
        }
        out.fill(0.0);
        states.fill(vec_f32::SoftmaxState::EMPTY);
        if fetch {
            let mut at = range.start - range.start % BS;
            while at < range.end {
                self.pool.prefetch(self.kv, self.il, at, kvh * hd..(kvh + n_kv) * hd, kvh * hdv..(kvh + n_kv) * hdv);
                at += BS;
            }
        }
        let mut p = range.start;
        while p < range.end {
            // (lane, length, column in the chunk) per block, and the blocks themselves.
            let mut runs = [(0usize, 0usize, 0usize); CHUNK];
            let mut blocks = [None; CHUNK];
            let (mut nb, mut width) = (0, 0);
            // Chunks end at multiples of CHUNK·BS positions, so a token's chunks are the same whatever range
            // around it is computed at once (see `tile`).
            while nb < CHUNK && p < range.end && (nb == 0 || !p.is_multiple_of(CHUNK * BS)) {
                let (kt, v, lane) = self.pool.block(self.kv, self.il, p);
                let n = (BS - lane).min(range.end - p);
                // Each key head's transposed tile against its query heads.
                for j in 0..n_kv {
                    let q = &qh[j * per_kv * hd..(j + 1) * per_kv * hd];
                    let t = &mut tile[j * per_kv * BS..(j + 1) * per_kv * BS];
                    let keys = (kvh + j) * hd * BS..(kvh + j + 1) * hd * BS;
                    match kt {
                        KvRow::F32(k) => vec_f32::dot_cols(q, &k[keys], BS, t),
                        KvRow::F16(k) => vec_f32::dot_cols_f16(q, &k[keys], BS, t),
                        // The 8-bit cache converts each block once for its query heads (as prefill's tiles
                        // convert theirs), then runs the f32 kernel.
                        KvRow::Q8 { .. } => vec_f32::dot_cols(q, kt.as_f32(keys, BS, &mut dequant), BS, t),
                    }
                }
                for h in 0..heads {
                    scores[h * row + width..h * row + width + n]
                        .copy_from_slice(&tile[h * BS + lane..h * BS + lane + n]);
                }
                runs[nb] = (lane, n, width);
                blocks[nb] = Some(v);
                nb += 1;
                width += n;
                p += n;
            }
            for (h, state) in states.iter_mut().enumerate() {
                self.softmax_step(&mut scores[h * row..h * row + width], state, &mut out[h * hdv..(h + 1) * hdv]);
            }
            for (&(lane, n, col), v) in runs[..nb].iter().zip(&blocks[..nb]) {
                let v = v.expect("filled above");
                for j in 0..n_kv {
                    let w = &scores[j * per_kv * row + col..];
                    let out = &mut out[j * per_kv * hdv..(j + 1) * per_kv * hdv];
                    // This key head's rows of the value tile (see `KvElem::store`).
                    let at = ((kvh + j) * BS + lane) * hdv;
                    match v {
                        KvRow::F32(v) => vec_f32::axpy_rows(n, w, row, &v[at..], hdv, out, hdv),
                        KvRow::F16(v) => vec_f32::axpy_rows_f16(n, w, row, &v[at..], hdv, out, hdv),
                        KvRow::Q8 { .. } => {
                            let rows = v.as_f32(at..at + n * hdv, 1, &mut dequant);
                            vec_f32::axpy_rows(n, w, row, rows, hdv, out, hdv)
                        }
                    }
                }
            }
        }
        SCORES.set(scores);
        DEQUANT.set(dequant);
    }

    /// One softmax step of a query row over the scores `sc` of a chunk, into its softmax `state`: the scores become
    /// weights in place, and the row's output so far (`out`, summed under an older maximum) is rescaled.
    fn softmax_step(&self, sc: &mut [f32], state: &mut vec_f32::SoftmaxState, out: &mut [f32]) {
        // Soft-capping (gemma2) bends the scaled scores, so the softmax then takes them unscaled.
        let scale = match self.softcap {
            Some(cap) => {
                sc.iter_mut().for_each(|v| *v = cap * (*v * self.scale / cap).tanh());
                1.0
            }
            None => self.scale,
        };
        let r = vec_f32::softmax_block(sc, scale, state);
        if r != 1.0 {
            vec_f32::scale(r, out);
        }
    }

    /// f32 scratch [`SpanRun::tile`] needs for `rows` query rows.
    fn tile_scratch(rows: usize, hd: usize, hdv: usize) -> usize {
        rows * BS + hd * BS + BS * hdv + rows * hdv
    }

    /// The normalised attention of a prompt tile: `q` holds `seen.len()` consecutive tokens' query heads (row
    /// `tt·heads + h` is head `h` of token `tt`), `seen` each token's visible positions, and `out` gets one row of
    /// `hdv` per query row. `scratch` has [`SpanRun::tile_scratch`] values.
    ///
    /// Each row's arithmetic is the one [`SpanRun::span`] does for that token alone: the same spans (cut at
    /// multiples of [`SPAN`]) merged in the same order, the same chunks of positions (cut at multiples of
    /// CHUNK·BS) with one softmax step each over exactly the row's positions in the chunk, the same dot products
    /// and the same fused multiply-adds of values in position order. Positions of the chunk a row does not see
    /// (later tokens of the tile, or before its window) get weight 0, and adding 0·v changes no sum.
    fn tile(&self, q: &[f32], seen: &[Range<usize>], out: &mut [f32], scratch: &mut [f32]) {
        let (hd, hdv) = (self.hd, self.hdv);
        let rows = q.len() / hd;
        let heads = rows / seen.len();
        let (tmp, scratch) = scratch.split_at_mut(rows * hdv);
        let all = seen.iter().map(|r| r.start).min().unwrap_or(0)..seen.iter().map(|r| r.end).max().unwrap_or(0);
        let mut states = [vec_f32::SoftmaxState::EMPTY; TILE_ROWS];
        let mut started = [false; TILE_ROWS];
        for span in spans(all.clone()) {
            let mut st = [vec_f32::SoftmaxState::EMPTY; TILE_ROWS];
            let within: [Range<usize>; TILE_TOKENS] = std::array::from_fn(|tt| match seen.get(tt) {
                Some(s) => s.start.max(span.start)..s.end.min(span.end),
                None => 0..0,
            });
            self.tile_span(q, span, all.end, &within[..seen.len()], tmp, &mut st[..rows], scratch);
            for r in 0..rows {
                if within[r / heads].is_empty() {
                    continue;
                }
                let (dst, src) = (&mut out[r * hdv..(r + 1) * hdv], &tmp[r * hdv..(r + 1) * hdv]);
                if started[r] {
                    merge_heads(dst, &mut states[r..r + 1], src, &st[r..r + 1], hdv);
                } else {
                    dst.copy_from_slice(src);
                    states[r] = st[r];
                    started[r] = true;
                }
            }
        }
        normalize(out, &states[..rows], hdv);
    }

    /// One span of [`SpanRun::tile`]: the unnormalised outputs and softmax states of every row over positions
    /// `range`, of which token `tt` sees `within[tt]` (possibly none). Each chunk first asks for the next one's
    /// blocks (up to position `ahead`) into L2: a long cache's blocks come from L3 or memory, scattered over the
    /// pool where the hardware prefetcher does not follow.
    #[allow(clippy::too_many_arguments)]
    fn tile_span(
        &self,
        q: &[f32],
        range: Range<usize>,
        ahead: usize,
        within: &[Range<usize>],
        out: &mut [f32],
        states: &mut [vec_f32::SoftmaxState],
        scratch: &mut [f32],
    ) {
        let (kvh, hd, hdv) = (self.kvh, self.hd, self.hdv);
        let rows = states.len();
        let heads = rows / within.len();
        let row = CHUNK * BS;
        let mut scores = SCORES.take();
        scores.resize(rows * row, 0.0);
        let (tile, scratch) = scratch.split_at_mut(rows * BS);
        let (kbuf, vbuf) = scratch.split_at_mut(hd * BS);
        let vbuf = &mut vbuf[..BS * hdv];
        out.fill(0.0);
        let mut p = range.start;
        while p < range.end {
            let first = p;
            let next = (first / (CHUNK * BS) + 1) * (CHUNK * BS);
            for at in (next..ahead.min(next + CHUNK * BS)).step_by(BS) {
                self.pool.prefetch(self.kv, self.il, at, kvh * hd..(kvh + 1) * hd, kvh * hdv..(kvh + 1) * hdv);
            }
            let mut runs = [(0usize, 0usize, 0usize); CHUNK];
            let mut blocks = [None; CHUNK];
            let (mut nb, mut width) = (0, 0);
            while nb < CHUNK && p < range.end && (nb == 0 || !p.is_multiple_of(CHUNK * BS)) {
                let (kt, v, lane) = self.pool.block(self.kv, self.il, p);
                let n = (BS - lane).min(range.end - p);
                vec_f32::dot_cols(q, kt.as_f32(kvh * hd * BS..(kvh + 1) * hd * BS, BS, kbuf), BS, tile);
                for r in 0..rows {
                    scores[r * row + width..r * row + width + n]
                        .copy_from_slice(&tile[r * BS + lane..r * BS + lane + n]);
                }
                runs[nb] = (lane, n, width);
                blocks[nb] = Some(v);
                nb += 1;
                width += n;
                p += n;
            }
            for (r, state) in states.iter_mut().enumerate() {
                let sc = &mut scores[r * row..r * row + width];
                let seen = &within[r / heads];
                // The row's positions in this chunk: columns a..b.
                let a = seen.start.clamp(first, first + width) - first;
                let b = (seen.end.clamp(first, first + width) - first).max(a);
                if a < b {
                    self.softmax_step(&mut sc[a..b], state, &mut out[r * hdv..(r + 1) * hdv]);
                }
                // (Most rows see the whole chunk: skip the empty fills' calls.)
                if a > 0 {
                    sc[..a].fill(0.0);
                }
                if b < width {
                    sc[b..].fill(0.0);
                }
            }
            for (&(lane, n, col), v) in runs[..nb].iter().zip(&blocks[..nb]) {
                let w = &scores[col..];
                let at = (kvh * BS + lane) * hdv;
                let v = v.expect("filled above");
                vec_f32::axpy_rows(n, w, row, v.as_f32(at..at + n * hdv, 1, vbuf), hdv, out, hdv);
            }
        }
        SCORES.set(scores);
    }
}
