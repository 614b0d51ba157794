//! The shared decoder forward pass: one function runs prefill, single-token decode and batched decode.
//!
//! A call takes a batch of sequences, each at its own position with its own KV block table, and a slice of new
//! tokens per sequence. All tokens of all sequences are stacked into one activation matrix, so every weight matrix
//! is read once per call whatever the batch holds: a long prompt (prefill), one token each for many users
//! (batched decode), or a mix (continuous batching). Only attention looks at sequences separately. Logits are
//! computed only for the positions that ask for them.

use std::sync::Arc;

use infer_kernels::matmul::{ActPrecision, MatmulScratch, PreQuant, WeightMatrix, matmul, matmul_multi};
use infer_kernels::parallel::{self, Chunks, DistinctIndices, Picked, for_each_row, for_each_row_in};
use infer_kernels::vec_f32;

use crate::gguf::{GgufError, GgufFile};

use super::config::{Activation, ModelConfig};
use super::kv_cache::{KvElem, KvError, KvPool, KvRow, SeqKv, TilesMut};
use super::ops;
use super::stats::{ActivationStats, Site};
use super::weights::{LayerWeights, ModelWeights};

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
            matmul: MatmulScratch::new(model.precision),
            stats: None,
        }
    }

    /// Starts gathering the statistics of every matrix's input (llama-imatrix's: the sum of each column's square)
    /// over the tokens of the following forward passes, for calibrated quantization.
    pub fn collect_stats(&mut self, model: &Model) {
        self.stats = Some(Box::new(ActivationStats::new(&model.config)));
    }

    /// Stops gathering and returns what was gathered.
    pub fn take_stats(&mut self) -> Option<ActivationStats> {
        self.stats.take().map(|s| *s)
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
}

/// How many KV blocks ahead of the one it reads a decoding token's attention prefetches (see
/// [`KvPool::prefetch`]). Measured with 16 sequences decoding at 512-528 cached positions: 714-719 t/s without,
/// 842-854 with 2 blocks (4: no better); one sequence at 1024-1056: 145-160 → 185-200 t/s.
const PREFETCH_BLOCKS: usize = 2;

/// Runs of attention tasks per thread over a prompt: enough to even out tokens with different cache lengths.
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
}

/// Per token `t` (in parallel with enough tokens): `rotate(t, q row, k row)`, then the rotated key and the value
/// row go into the token's KV tiles. The tiles must all differ (one new position per sequence), which
/// [`DistinctIndices`] checks.
fn rotate_and_store<T: KvElem>(
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    (kt, vt): (&mut [T], &mut [T]),
    at: &KvAt<'_>,
    rotate: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) {
    let n = at.tiles.len();
    let (q_dim, k_dim, v_dim) = (q.len() / n.max(1), k.len() / n.max(1), v.len() / n.max(1));
    let tiles = DistinctIndices::new(at.tiles);
    let rows = (
        Chunks::new(q, q_dim),
        Chunks::new(k, k_dim),
        Picked::new(kt, at.sizes.0, tiles),
        Picked::new(vt, at.sizes.1, tiles),
    );
    for_each_row(rows, n >= PAR_ROWS, |t, (qr, kr, k_tile, v_tile)| {
        rotate(t, qr, kr);
        T::store(k_tile, v_tile, at.lanes[t], at.bs, kr, &v[t * v_dim..(t + 1) * v_dim]);
    });
}

impl Model {
    /// Builds the model from an open file: configuration from metadata, then every tensor checked by name, shape
    /// and type.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Model, GgufError> {
        let config = ModelConfig::from_metadata(file.metadata())?;
        let weights = ModelWeights::load(&file, &config)?;
        let rope_freqs = [
            ops::rope_freqs(config.n_rot, config.rope_base),
            if config.layer_is_swa.iter().any(|&s| s) {
                ops::rope_freqs(config.n_rot, config.rope_base_swa)
            } else {
                Vec::new()
            },
        ];
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
                    };
                    match pool.tiles_mut(il) {
                        TilesMut::F32 { k: kt, v: vt } => rotate_and_store(q, k, v, (kt, vt), &at, rotate),
                        TilesMut::F16 { k: kt, v: vt } => rotate_and_store(q, k, v, (kt, vt), &at, rotate),
                    }
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
            self.attention(il, items, pool, &s.plan, &s.q[..t_count * q_dim], att, &wo, &mut s.matmul);

            // Output projection, optional post-norm, residual.
            if let Some(st) = &mut s.stats {
                st.add(il, Site::AttnOut, &s.att[..t_count * att_dim]);
            }
            matmul(&wo, &s.att[..t_count * att_dim], t_count, &mut s.xb2[..t_count * n_embd], &mut s.matmul);
            // Residual, then the feed-forward's input norm (quantized for its first matmul), in one pass.
            let (wg, wu) = (self.mat(&lw.ffn_gate), self.mat(&lw.ffn_up));
            let quant = s.matmul.prequantize(&[&wg, &wu], &s.xb[..t_count * n_embd], n_embd);
            self.residual(
                &mut s.x[..t_count * n_embd],
                &s.xb2[..t_count * n_embd],
                lw.attn_post_norm.as_deref(),
                Some((lw.ffn_norm.as_slice(), &mut s.xb[..t_count * n_embd])),
                quant,
            );

            // Feed-forward.
            {
                let mut outs: [&mut [f32]; 2] = [&mut s.gate[..t_count * n_ff], &mut s.up[..t_count * n_ff]];
                if let Some(st) = &mut s.stats {
                    st.add(il, Site::FfnIn, &s.xb[..t_count * n_embd]);
                }
                matmul_multi(&[&wg, &wu], &s.xb[..t_count * n_embd], t_count, &mut outs, &mut s.matmul);
            }
            let wd = self.mat(&lw.ffn_down);
            {
                let up = &s.up[..t_count * n_ff];
                let act = c.activation;
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
            if let Some(st) = &mut s.stats {
                st.output.add(&s.out_x[..n_out * n_embd], n_embd);
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
    /// with a streaming softmax over the cache's blocks. A task takes one token and a run of query heads that share
    /// a key head, so each key and value is read once for all of them; with too few tokens to keep the threads busy
    /// that way, one head per task. Each head's arithmetic is the same either way, so results do not depend on the
    /// split (nor, therefore, on the batch).
    ///
    /// With enough tokens for every thread, a task takes whole tokens (all their heads) and also quantizes each
    /// finished row for the output projection `wo` (see [`MatmulScratch::prequantize`]), which then skips its own
    /// quantization pass. With fewer, tasks take single heads, and `wo` quantizes its few rows itself.
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
    ) {
        const MAX_HEADS: usize = 8;
        const BS: usize = super::kv_cache::DEFAULT_BLOCK_SIZE;
        const CHUNK: usize = 8;
        let c = &self.config;
        let (hd, hdv, group) = (c.head_dim, c.head_dim_v, c.gqa_group());
        let q_dim = c.q_dim();
        let window = pool.window(il);
        assert_eq!(pool.block_size, BS, "attention's score buffer is sized for the default block size");
        let scale = c.attn_scale;
        let threads = parallel::threads();
        let whole_tokens = plan.len() >= 4 * threads;
        let heads = if whole_tokens || plan.len() * c.n_head_kv >= 4 * threads {
            (1..=MAX_HEADS.min(group)).rev().find(|h| group.is_multiple_of(*h)).unwrap_or(1)
        } else {
            1
        };
        let runs_per_token = c.n_head / heads;
        let task = |idx: usize, out: &mut [f32]| {
            let (t, h0) = (idx / runs_per_token, idx % runs_per_token * heads);
            let slot = plan[t];
            let kv = &*items[slot.item].kv;
            let kvh = h0 / group;
            // A prompt's tokens read the same blocks one after another, which stay cached; a decoding token
            // reads its sequence's blocks once per step, from memory.
            let fetch_ahead = items[slot.item].tokens.len() == 1;
            let qh = &q[t * q_dim + h0 * hd..t * q_dim + (h0 + heads) * hd];
            let lo = window.map_or(0, |w| (slot.pos + 1).saturating_sub(w));
            out.fill(0.0);
            let mut softmax = [vec_f32::SoftmaxState::EMPTY; MAX_HEADS];
            // Positions go in chunks of up to CHUNK blocks: their scores first (one row of CHUNK·BS per head), one
            // softmax step per head over the whole chunk, then the values; per-block softmax steps of 16 scores
            // were mostly overhead.
            let row = CHUNK * BS;
            // The score rows live in a per-thread buffer: a fresh zeroed array per task (4 KB) was most of the
            // attention tasks' fixed cost at short contexts. Only what a chunk writes is read back.
            let mut scores = SCORES.take();
            scores.resize(heads * row, 0.0);
            let mut tile = [0f32; MAX_HEADS * BS];
            let tile = &mut tile[..heads * BS];
            let mut p = lo;
            while p <= slot.pos {
                // (lane, length, column in the chunk) per block, and the blocks themselves.
                let mut runs = [(0usize, 0usize, 0usize); CHUNK];
                let mut blocks = [None; CHUNK];
                let (mut nb, mut width) = (0, 0);
                while nb < CHUNK && p <= slot.pos {
                    let (kt, v, lane) = pool.block(kv, il, p);
                    let ahead = p - lane + PREFETCH_BLOCKS * BS;
                    if fetch_ahead && ahead <= slot.pos {
                        pool.prefetch(kv, il, ahead, kvh * hd..(kvh + 1) * hd, kvh * hdv..(kvh + 1) * hdv);
                    }
                    let n = (BS - lane).min(slot.pos + 1 - p);
                    match kt {
                        KvRow::F32(k) => vec_f32::dot_cols(qh, &k[kvh * hd * BS..(kvh + 1) * hd * BS], BS, tile),
                        KvRow::F16(k) => vec_f32::dot_cols_f16(qh, &k[kvh * hd * BS..(kvh + 1) * hd * BS], BS, tile),
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
                for (h, state) in softmax[..heads].iter_mut().enumerate() {
                    // Scores become softmax weights in place; what was summed under an older maximum is rescaled.
                    let r = vec_f32::softmax_block(&mut scores[h * row..h * row + width], scale, state);
                    if r != 1.0 {
                        vec_f32::scale(r, &mut out[h * hdv..(h + 1) * hdv]);
                    }
                }
                for (&(lane, n, col), v) in runs[..nb].iter().zip(&blocks[..nb]) {
                    let w = &scores[col..];
                    let at = lane * c.v_dim() + kvh * hdv;
                    match v.expect("filled above") {
                        KvRow::F32(v) => vec_f32::axpy_rows(n, w, row, &v[at..], c.v_dim(), out, hdv),
                        KvRow::F16(v) => vec_f32::axpy_rows_f16(n, w, row, &v[at..], c.v_dim(), out, hdv),
                    }
                }
            }
            for (h, state) in softmax[..heads].iter().enumerate() {
                if state.sum > 0.0 {
                    vec_f32::scale(1.0 / state.sum, &mut out[h * hdv..(h + 1) * hdv]);
                }
            }
            SCORES.set(scores);
        };
        if !whole_tokens {
            let tasks = if plan.len() * runs_per_token >= 2 { threads * ATTENTION_TASKS_PER_THREAD } else { 1 };
            for_each_row_in(Chunks::new(att, heads * hdv), tasks, task);
            return;
        }
        // With one new token per sequence (decode), one contiguous run of tokens per thread: the rows then stay on
        // the thread that reads them next (small runs interleaved them and cost 5% of a 16-sequence step). A
        // prompt's tokens differ in cost (each sees one more position than the one before), so there threads claim
        // small runs and the late, expensive tokens spread over all of them.
        let tasks = if plan.len() > items.len() { threads * ATTENTION_TASKS_PER_THREAD } else { threads };
        let width = c.n_head * hdv;
        let quant = mm.prequantize(&[wo], att, width);
        for_rows_in(att, width, quant, tasks, |t, row| {
            for (r, out) in row.chunks_exact_mut(heads * hdv).enumerate() {
                task(t * runs_per_token + r, out);
            }
        });
    }
}
