//! The small per-token operations of the decoder: RMSNorm, rotary embeddings, activations, softcapping.
//!
//! These touch a few thousand values per token, against millions of weights in the matmuls, so plain loops that
//! the compiler vectorises are enough. Reductions accumulate in f64 where the sum is long, which keeps results
//! close to the f32 reference at no measurable cost.

use super::config::RopeStyle;

/// `1 / rms(x)`, with `rms(x) = sqrt(mean(x²) + eps)`; the sum of squares runs in f64.
///
/// The sum runs in eight independent lanes (element `i` into lane `i % 8`, lanes added pairwise at the end): one
/// running sum is a chain of dependent additions, 4 cycles each, which made this 3% of a 16-sequence decode step.
pub fn inv_rms(x: &[f32], eps: f32) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f64; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += (v as f64) * (v as f64);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += (v as f64) * (v as f64);
    }
    let ss = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32
}

/// `out = x / rms(x) * w`.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    debug_assert!(out.len() == x.len() && x.len() == w.len());
    let inv = inv_rms(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// RMSNorm in place.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = inv_rms(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

/// The rotary frequencies `base^(-2i / n_rot)` for `i < n_rot / 2`, in f64 so long contexts keep their angles
/// exact. They depend only on the model, so it computes them once ([`rope_table`] per token was mostly `powf`).
pub fn rope_freqs(n_rot: usize, base: f32) -> Vec<f64> {
    (0..n_rot / 2).map(|i| (base as f64).powf(-2.0 * i as f64 / n_rot as f64)).collect()
}

/// Rotation angles' cosines and sines for one position: one pair per frequency (`θ_i = pos / scale · freq_i`).
pub fn rope_table(pos: usize, freqs: &[f64], scale: f32, cos: &mut [f32], sin: &mut [f32]) {
    let p = pos as f64 / scale as f64;
    for ((&f, c), s) in freqs.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let theta = p * f;
        *c = theta.cos() as f32;
        *s = theta.sin() as f32;
    }
}

/// Rotates the first `n_rot` dimensions of one head by the precomputed angles.
pub fn rope_apply(head: &mut [f32], n_rot: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    let half = n_rot / 2;
    match style {
        RopeStyle::Interleaved => {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = a * sin[i] + b * cos[i];
            }
        }
        RopeStyle::Neox => {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// SiLU (x·σ(x)) of the gate times the up projection, into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    infer_kernels::vec_f32::swiglu(gate, up)
}

/// GELU (tanh approximation) of the gate times the up projection, into `gate`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    infer_kernels::vec_f32::geglu(gate, up)
}

/// `cap · tanh(x / cap)` on every logit.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, 1.0];
        let mut out = [0f32; 4];
        rmsnorm(&mut out, &x, &w, 1e-6);
        let rms = ((1.0 + 4.0 + 9.0 + 0.25) / 4.0 + 1e-6f64).sqrt();
        for i in 0..4 {
            assert!((out[i] as f64 - x[i] as f64 / rms * w[i] as f64).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let mut cos = [0f32; 4];
        let mut sin = [0f32; 4];
        rope_table(0, &rope_freqs(8, 10000.0), 1.0, &mut cos, &mut sin);
        let orig = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut h = orig;
        rope_apply(&mut h, 8, RopeStyle::Neox, &cos, &sin);
        assert_eq!(h, orig);
        rope_table(37, &rope_freqs(8, 10000.0), 1.0, &mut cos, &mut sin);
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let mut h = orig;
            rope_apply(&mut h, 8, style, &cos, &sin);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = h.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
        }
    }
}
