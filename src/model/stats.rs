//! Activation statistics for calibrated quantization: per weight matrix, the sum over tokens of each input
//! column's square, which is what llama-imatrix collects. A column whose inputs are large matters more to the
//! matrix's outputs, so `infer quantize --calibrate` weighs the rounding error of its weights by this mean square.

use std::sync::Arc;

use super::config::ModelConfig;

/// Σ x² per column over the rows seen, and the number of rows; optionally the whole Gram matrix Σ xᵀx.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColumnSums {
    pub sum_sq: Vec<f64>,
    pub rows: u64,
    /// Σ xᵀx (`width × width`, row-major), if gathered: what GPTQ-style quantization needs.
    pub gram: Option<Vec<f32>>,
}

impl ColumnSums {
    fn new(width: usize, gram: bool) -> ColumnSums {
        ColumnSums { sum_sq: vec![0.0; width], rows: 0, gram: gram.then(|| vec![0.0; width * width]) }
    }

    /// Adds the rows of `x` (`width` values each).
    pub fn add(&mut self, x: &[f32], width: usize) {
        for row in x.chunks_exact(width) {
            for (s, &v) in self.sum_sq.iter_mut().zip(row) {
                *s += v as f64 * v as f64;
            }
            self.rows += 1;
        }
        if let Some(g) = &mut self.gram {
            add_gram(g, x, width);
        }
    }

    /// The mean square per column, or `None` before any row was seen.
    pub fn mean_sq(&self) -> Option<Vec<f32>> {
        (self.rows > 0).then(|| self.sum_sq.iter().map(|&s| (s / self.rows as f64) as f32).collect())
    }
}

/// Where a matrix's input comes from in a decoder layer: the matrices that share an input share its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The normed layer input: `attn_q`, `attn_k`, `attn_v`.
    AttnIn = 0,
    /// The attention heads' output: `attn_output`.
    AttnOut = 1,
    /// The normed feed-forward input: `ffn_gate`, `ffn_up`.
    FfnIn = 2,
    /// The gated activation: `ffn_down`.
    FfnDownIn = 3,
}

/// Where the statistics of a GGUF tensor's input are kept (see [`ActivationStats::for_tensor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputOf {
    Layer(usize, Site),
    /// The output projection's input.
    Output,
}

impl InputOf {
    /// The input of the GGUF tensor `name` (`blk.N.attn_q.weight`, `output.weight`, ...), if it is a matrix the
    /// decoder multiplies. `tied_output`: `token_embd.weight` doubles as the output projection.
    pub fn of_tensor(name: &str, tied_output: bool) -> Option<InputOf> {
        if name == "output.weight" || (tied_output && name == "token_embd.weight") {
            return Some(InputOf::Output);
        }
        let rest = name.strip_prefix("blk.")?;
        let (layer, matrix) = rest.split_once('.')?;
        let site = match matrix {
            "attn_q.weight" | "attn_k.weight" | "attn_v.weight" => Site::AttnIn,
            "attn_output.weight" => Site::AttnOut,
            "ffn_gate.weight" | "ffn_up.weight" => Site::FfnIn,
            "ffn_down.weight" => Site::FfnDownIn,
            _ => return None,
        };
        Some(InputOf::Layer(layer.parse::<usize>().ok()?, site))
    }
}

/// Hears of each layer's statistics as soon as the forward pass has left that layer, so that a consumer (the
/// quantizer's self-calibration) can use them while the pass goes on. Only meaningful when the statistics come
/// from one forward pass: with more, every pass reports its layers again, with the sums so far.
pub trait StatsSink: Send + Sync {
    /// Layer `layer`'s four inputs, indexed by [`Site`].
    fn layer_done(&self, layer: usize, sums: &[ColumnSums; 4]);
    /// The output projection's input (after the last layer's [`layer_done`](Self::layer_done)).
    fn output_done(&self, sums: &ColumnSums);
}

/// A [`StatsSink`] held by [`ActivationStats`] (compared by identity).
#[derive(Clone)]
pub struct Sink(pub Arc<dyn StatsSink>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

impl PartialEq for Sink {
    fn eq(&self, other: &Sink) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The statistics of every matrix input of a model, gathered by [`super::ForwardScratch::collect_stats`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActivationStats {
    /// Per layer, indexed by [`Site`].
    pub layers: Vec<[ColumnSums; 4]>,
    /// The final normed hidden state, the output projection's input (at every position).
    pub output: ColumnSums,
    /// Told of each layer as the forward pass leaves it.
    pub sink: Option<Sink>,
}

impl ActivationStats {
    /// Empty statistics; with `gram`, the Gram matrices too (`width²` values per input).
    pub fn new(c: &ModelConfig, gram: bool) -> ActivationStats {
        let layer = || {
            [
                ColumnSums::new(c.n_embd, gram),
                ColumnSums::new(c.n_head * c.head_dim_v, gram),
                ColumnSums::new(c.n_embd, gram),
                ColumnSums::new(c.n_ff, gram),
            ]
        };
        ActivationStats {
            layers: (0..c.n_layer).map(|_| layer()).collect(),
            output: ColumnSums::new(c.n_embd, gram),
            sink: None,
        }
    }

    /// Adds rows of `layer`'s input at `site`. Each layer's first input ([`Site::AttnIn`]) means the pass has left
    /// the layer before, whose statistics the sink then hears of.
    pub(crate) fn add(&mut self, layer: usize, site: Site, x: &[f32]) {
        if site == Site::AttnIn
            && layer > 0
            && let Some(sink) = &self.sink
        {
            sink.0.layer_done(layer - 1, &self.layers[layer - 1]);
        }
        let sums = &mut self.layers[layer][site as usize];
        let width = sums.sum_sq.len();
        sums.add(x, width);
    }

    /// Adds rows of the output projection's input (the pass has left the last layer).
    pub(crate) fn add_output(&mut self, x: &[f32]) {
        let width = self.output.sum_sq.len();
        self.output.add(x, width);
        if let Some(sink) = &self.sink {
            if let Some(last) = self.layers.len().checked_sub(1) {
                sink.0.layer_done(last, &self.layers[last]);
            }
            sink.0.output_done(&self.output);
        }
    }

    /// The statistics of the input of the GGUF tensor `name` (`blk.N.attn_q.weight`, `output.weight`, ...), if it
    /// is a matrix this model multiplies. `tied_output`: `token_embd.weight` doubles as the output projection.
    pub fn for_tensor(&self, name: &str, tied_output: bool) -> Option<&ColumnSums> {
        match InputOf::of_tensor(name, tied_output)? {
            InputOf::Output => Some(&self.output),
            InputOf::Layer(layer, site) => self.layers.get(layer).map(|l| &l[site as usize]),
        }
    }
}

/// `g += xᵀx` for the rows of `x` (`width` values each), as a matrix product: `xᵀ` (`width × rows`) times itself.
fn add_gram(g: &mut [f32], x: &[f32], width: usize) {
    use infer_kernels::GgmlType;
    use infer_kernels::matmul::{ActPrecision, MatmulScratch, WeightMatrix, matmul};
    let rows = x.len() / width;
    if rows == 0 {
        return;
    }
    let mut xt = vec![0f32; width * rows];
    for (r, row) in x.chunks_exact(width).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            xt[c * rows + r] = v;
        }
    }
    let bytes = infer_kernels::quant::blocks_as_bytes(&xt);
    let w = WeightMatrix::new(GgmlType::F32, bytes, width, rows).expect("an F32 matrix of whole rows");
    let mut out = vec![0f32; width * width];
    matmul(&w, &xt, width, &mut out, &mut MatmulScratch::new(ActPrecision::Q8x2));
    for (a, b) in g.iter_mut().zip(&out) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gram_matrix_is_the_sum_of_outer_products() {
        let (width, rows) = (40, 23);
        let x: Vec<f32> = (0..width * rows).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let mut s = ColumnSums::new(width, true);
        s.add(&x[..width * 10], width);
        s.add(&x[width * 10..], width);
        let g = s.gram.as_ref().unwrap();
        for a in 0..width {
            for b in 0..width {
                let want: f64 = x.chunks_exact(width).map(|r| r[a] as f64 * r[b] as f64).sum();
                let got = g[a * width + b] as f64;
                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "({a}, {b}): {got} vs {want}");
            }
            assert!((g[a * width + a] as f64 - s.sum_sq[a]).abs() <= 1e-4 * (1.0 + s.sum_sq[a]));
        }
    }
}
