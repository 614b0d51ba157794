//! Calibration: run the model over a text and keep, for every weight matrix, the mean square of each input column
//! (llama-imatrix's statistic), so that the quantizer spends its precision on the columns whose inputs are large.
//! llama.cpp does this with a separate tool and an imatrix file; here it is a step of `infer quantize`. With a
//! text it can also keep each input's whole Gram matrix, for rounding with error feedback ([`super::gptq`]).
//!
//! Without a text, [`self_calibrate`] runs the model over a fixed pseudo-random sequence of its own vocabulary's
//! tokens. Which columns carry large inputs is mostly a property of the model (a few hidden-state channels are large
//! whatever the text), so this captures most of a real text's benefit: on SmolLM2 q4_0 (4 chunks of the held-out
//! text), 128 and 47 random tokens gave a mean KLD of 0.264 against the f32 source, real text 0.258 (with error
//! feedback, 8 chunks of it, 0.207), and round to nearest 0.407.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use super::gptq::Factor;

use crate::eval::{EvalError, Runner};
use crate::gguf::GgufFile;
use crate::model::Model;
use crate::model::stats::{ColumnSums, InputOf, Sink, StatsSink};
use crate::tokenizer::{TokenType, TokenTypes, Tokenizer};

/// Tokens [`self_calibrate`] runs (after BOS): enough to find the large channels, and one pass of the f32 matrix
/// kernel over the weights (it takes 48 activation rows at a time). 256 gave no lower KLD than 128 on SmolLM2; 32
/// (with Q4_0 trying only 2 scales) raised SmolLM2's Q4_0 KLD by 2% but Gemma 3's by 25%.
pub const SELF_CALIBRATION_TOKENS: usize = 47;

/// Per GGUF tensor name, one importance value per column: the mean square of the input that column multiplies.
#[derive(Debug, Clone, Default)]
pub struct Importance {
    by_tensor: HashMap<String, Vec<f32>>,
    /// Per GGUF tensor name, the error-feedback factor of its input (shared by the matrices that share an input),
    /// when the Gram matrices were gathered.
    factors: HashMap<String, Arc<Factor>>,
    /// Tokens the statistics were gathered over.
    pub tokens: usize,
}

impl Importance {
    pub fn get(&self, tensor: &str) -> Option<&Vec<f32>> {
        self.by_tensor.get(tensor)
    }

    /// The error-feedback factor of `tensor`'s input, if gathered (see [`super::gptq`]).
    pub fn factor(&self, tensor: &str) -> Option<&Factor> {
        self.factors.get(tensor).map(Arc::as_ref)
    }

    /// How many tensors have an importance vector.
    pub fn len(&self) -> usize {
        self.by_tensor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_tensor.is_empty()
    }
}

/// Runs `model` over `text` in chunks of `n_ctx` tokens (each from an empty cache, starting with BOS if the model
/// adds one; a shorter text is one chunk) and gathers the importance of every matrix's columns, at most
/// `max_chunks` chunks. With `gram`, also each input's Gram matrix, for error feedback ([`super::gptq`]).
/// `on_chunk(done, total)` hears of progress.
#[allow(clippy::too_many_arguments)]
pub fn calibrate(
    model: &Model,
    tokenizer: &Tokenizer,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
    gram: bool,
    cancel: &AtomicBool,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<Importance, EvalError> {
    let tokens = tokenizer.encode(text, false, false);
    if tokens.is_empty() {
        return Err(EvalError::TooFewTokens { have: 0, need: 1, n_ctx });
    }
    let body = n_ctx.saturating_sub(1).max(1);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
    let chunks: Vec<Vec<u32>> = tokens
        .chunks(body)
        .take(max_chunks.unwrap_or(usize::MAX))
        .map(|c| bos.into_iter().chain(c.iter().copied()).collect())
        .collect();
    gather(model, &chunks, n_ctx, gram, cancel, on_chunk)
}

/// Importance without a text: the model run over [`SELF_CALIBRATION_TOKENS`] tokens drawn from its vocabulary
/// (normal tokens only, by their types in `vocab`) by a fixed-seed generator, so the same model always gets the
/// same importance. Each layer's importance goes to `into` as soon as the forward pass has left the layer, so that
/// the quantizer can search that layer's matrices while the pass goes on ([`Staged`]). Returns the number of tokens
/// run.
pub fn self_calibrate(
    model: &Model,
    vocab: &TokenTypes,
    cancel: &AtomicBool,
    into: Arc<Staged>,
) -> Result<usize, EvalError> {
    let normal: Vec<u32> = (0..vocab.types.len() as u32)
        .filter(|&id| matches!(vocab.types[id as usize], TokenType::Normal | TokenType::Undefined))
        .collect();
    if normal.is_empty() {
        return Err(EvalError::TooFewTokens { have: 0, need: 1, n_ctx: SELF_CALIBRATION_TOKENS });
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let chunk: Vec<u32> = vocab
        .bos
        .into_iter()
        .chain((0..SELF_CALIBRATION_TOKENS).map(|_| normal[rng.random_range(0..normal.len())]))
        .collect();
    if cancel.load(Ordering::Relaxed) {
        return Err(EvalError::Cancelled);
    }
    let mut runner = Runner::new(model, chunk.len(), crate::model::KvDtype::F16);
    let scratch = runner.scratch_mut();
    scratch.collect_stats(model, false);
    scratch.stats_mut().expect("collect_stats was called above").sink = Some(Sink(into));
    // One pass (the whole chunk is one prefill piece), so each layer's statistics are final when the sink hears
    // of them.
    runner.run_chunk(&chunk, chunk.len(), |_, _| {})?;
    Ok(chunk.len())
}

/// A site's importance: the mean square of each column, with a floor under the columns the text never excited
/// (they still hold weights).
fn importance_of(sums: &ColumnSums) -> Option<Vec<f32>> {
    let mut mean = sums.mean_sq()?;
    let floor = 1e-4 * mean.iter().sum::<f32>() / mean.len() as f32;
    mean.iter_mut().for_each(|v| *v = v.max(floor));
    Some(mean)
}

/// Importance that arrives while the quantizer runs: a [`StatsSink`] for [`self_calibrate`], which fills it in
/// layer by layer, and a source the quantizer waits on for each tensor ([`Staged::wait`]). The values are those a
/// finished calibration would give, so the output does not depend on how the two threads interleave.
pub struct Staged {
    tied_output: bool,
    state: Mutex<StagedState>,
    ready: Condvar,
}

#[derive(Default)]
struct StagedState {
    /// Per layer the pass has left, each site's importance (indexed by [`crate::model::stats::Site`]).
    layers: Vec<Option<[Option<Vec<f32>>; 4]>>,
    /// The output projection's input, once the pass has reached it.
    output: Option<Option<Vec<f32>>>,
    /// Nothing more will come (the calibration finished, failed or was cancelled).
    ended: bool,
}

impl Staged {
    /// For the tensors of `file` (which tells whether the output projection is tied to the embedding).
    pub fn new(file: &GgufFile) -> Staged {
        Staged {
            tied_output: file.tensor_info("output.weight").is_none(),
            state: Mutex::new(StagedState::default()),
            ready: Condvar::new(),
        }
    }

    /// When `tensor`'s importance can arrive, to order the work: 0 for a tensor with none to wait for, then by
    /// layer, the output projection last.
    pub fn stage(&self, tensor: &str) -> usize {
        match InputOf::of_tensor(tensor, self.tied_output) {
            None => 0,
            Some(InputOf::Layer(layer, _)) => layer.saturating_add(1),
            Some(InputOf::Output) => usize::MAX,
        }
    }

    /// `tensor`'s importance, waiting until the pass has left its layer; `None` if it has none (then or after a
    /// failed calibration).
    pub fn wait(&self, tensor: &str) -> Option<Vec<f32>> {
        let input = InputOf::of_tensor(tensor, self.tied_output)?;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let got = match input {
                InputOf::Layer(layer, site) => {
                    state.layers.get(layer).and_then(Option::as_ref).map(|sites| sites[site as usize].clone())
                }
                InputOf::Output => state.output.clone(),
            };
            if let Some(v) = got {
                return v;
            }
            if state.ended {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Marks the calibration over, whatever its outcome: every wait returns.
    pub fn end(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
        self.ready.notify_all();
    }
}

impl StatsSink for Staged {
    fn layer_done(&self, layer: usize, sums: &[ColumnSums; 4]) {
        let sites = sums.each_ref().map(importance_of);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.layers.len() <= layer {
            state.layers.resize(layer + 1, None);
        }
        state.layers[layer] = Some(sites);
        drop(state);
        super::timeline::mark!("calibration left layer {layer}");
        self.ready.notify_all();
    }

    fn output_done(&self, sums: &ColumnSums) {
        let v = importance_of(sums);
        self.state.lock().unwrap_or_else(|e| e.into_inner()).output = Some(v);
        super::timeline::mark!("calibration done");
        self.ready.notify_all();
    }
}

/// Runs each chunk from an empty cache with statistics on, and turns them into per-tensor importance.
fn gather(
    model: &Model,
    chunks: &[Vec<u32>],
    n_ctx: usize,
    gram: bool,
    cancel: &AtomicBool,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<Importance, EvalError> {
    let mut runner = Runner::new(model, n_ctx, crate::model::KvDtype::F16);
    runner.scratch_mut().collect_stats(model, gram);
    for (i, chunk) in chunks.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return Err(EvalError::Cancelled);
        }
        // No logits: the statistics (of the output projection's input too) are gathered at every position.
        runner.run_chunk(chunk, chunk.len(), |_, _| {})?;
        on_chunk(i + 1, chunks.len());
    }
    let stats = runner.scratch_mut().take_stats().expect("collect_stats was called above");
    let tied = model.file().tensor_info("output.weight").is_none();
    let mut by_tensor = HashMap::new();
    for info in model.file().tensors() {
        if let Some(mean) = stats.for_tensor(&info.name, tied).and_then(importance_of)
            && mean.len() as u64 == info.ne0()
        {
            by_tensor.insert(info.name.clone(), mean);
        }
    }
    // One factor per distinct input, shared by the matrices that read it.
    let sites: Vec<_> = stats.layers.iter().flatten().chain([&stats.output]).collect();
    let built: Vec<Option<Arc<Factor>>> = sites
        .par_iter()
        .map(|s| s.gram.as_ref().and_then(|g| Factor::new(g, s.sum_sq.len(), s.rows)).map(Arc::new))
        .collect();
    let mut factors = HashMap::new();
    for info in model.file().tensors() {
        if let Some(s) = stats.for_tensor(&info.name, tied)
            && let Some(k) = sites.iter().position(|&t| std::ptr::eq(t, s))
            && let Some(f) = &built[k]
            && f.n() as u64 == info.ne0()
        {
            factors.insert(info.name.clone(), f.clone());
        }
    }
    Ok(Importance { by_tensor, factors, tokens: chunks.iter().map(Vec::len).sum() })
}
