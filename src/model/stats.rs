//! Activation statistics for calibrated quantization: per weight matrix, the sum over tokens of each input
//! column's square, which is what llama-imatrix collects. A column whose inputs are large matters more to the
//! matrix's outputs, so `infer quantize --calibrate` weighs the rounding error of its weights by this mean square.

use super::config::ModelConfig;

/// Σ x² per column over the rows seen, and the number of rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColumnSums {
    pub sum_sq: Vec<f64>,
    pub rows: u64,
}

impl ColumnSums {
    fn new(width: usize) -> ColumnSums {
        ColumnSums { sum_sq: vec![0.0; width], rows: 0 }
    }

    /// Adds the rows of `x` (`width` values each).
    pub fn add(&mut self, x: &[f32], width: usize) {
        for row in x.chunks_exact(width) {
            for (s, &v) in self.sum_sq.iter_mut().zip(row) {
                *s += v as f64 * v as f64;
            }
            self.rows += 1;
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

/// The statistics of every matrix input of a model, gathered by [`super::ForwardScratch::collect_stats`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActivationStats {
    /// Per layer, indexed by [`Site`].
    pub layers: Vec<[ColumnSums; 4]>,
    /// The final normed hidden state, the output projection's input (only positions that produced logits).
    pub output: ColumnSums,
}

impl ActivationStats {
    pub fn new(c: &ModelConfig) -> ActivationStats {
        let layer = || {
            [
                ColumnSums::new(c.n_embd),
                ColumnSums::new(c.n_head * c.head_dim_v),
                ColumnSums::new(c.n_embd),
                ColumnSums::new(c.n_ff),
            ]
        };
        ActivationStats { layers: (0..c.n_layer).map(|_| layer()).collect(), output: ColumnSums::new(c.n_embd) }
    }

    pub(crate) fn add(&mut self, layer: usize, site: Site, x: &[f32]) {
        let sums = &mut self.layers[layer][site as usize];
        let width = sums.sum_sq.len();
        sums.add(x, width);
    }

    /// The statistics of the input of the GGUF tensor `name` (`blk.N.attn_q.weight`, `output.weight`, ...), if it
    /// is a matrix this model multiplies. `tied_output`: `token_embd.weight` doubles as the output projection.
    pub fn for_tensor(&self, name: &str, tied_output: bool) -> Option<&ColumnSums> {
        if name == "output.weight" || (tied_output && name == "token_embd.weight") {
            return Some(&self.output);
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
        self.layers.get(layer.parse::<usize>().ok()?).map(|l| &l[site as usize])
    }
}
