//! Locally typical sampling (`typical_p`; Meister et al., "Locally Typical Sampling", 2022; llama.cpp's
//! `--typical`, ollama's and llama-server's `typical_p`); our own implementation of the published definition.
//!
//! Natural text is neither the most likely continuation at every step nor an unlikely one: its tokens carry about
//! as much information (surprise, `−ln p`) as the distribution does on average (its entropy `H`). So the tokens are
//! ranked by how far their surprise lies from `H`, and the smallest set of the closest whose probability mass
//! reaches `typical_p` is kept. Unlike top-p, this can drop the single most likely token when it is far less
//! surprising than the rest (a safe but dull choice in a flat distribution). It runs after top-k and before top-p
//! (llama.cpp's order), on the probabilities at temperature 1 of what the earlier filters left.

use std::cmp::Ordering;

use super::{Cand, by_logit_desc, exp_nonpos, softmax_entropy};

/// Keeps the typical set of `cands` (largest logit `max`) for mass `p` in (0, 1): at least one token, left in
/// [`by_logit_desc`] order so the draw order still depends on the logits alone. `ranked` and `kept` are scratch.
pub(super) fn keep_typical(
    cands: &mut Vec<Cand>,
    max: f32,
    p: f32,
    ranked: &mut Vec<(f64, Cand)>,
    kept: &mut Vec<Cand>,
) {
    if cands.len() < 2 {
        return;
    }
    let (z, entropy) = softmax_entropy(cands, max);
    let ln_z = z.ln();
    ranked.clear();
    ranked.extend(cands.iter().map(|&c| ((-(f64::from(c.logit - max) - ln_z) - entropy).abs(), c)));
    // Closest to the entropy first; equal distances in the logits' own order, so the cut is deterministic.
    ranked.sort_unstable_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal).then(by_logit_desc(&a.1, &b.1)));
    let target = f64::from(p) * z;
    let mut mass = 0.0f64;
    kept.clear();
    for &(_, c) in ranked.iter() {
        kept.push(c);
        mass += f64::from(exp_nonpos(c.logit - max));
        if mass >= target {
            break;
        }
    }
    kept.sort_unstable_by(by_logit_desc);
    std::mem::swap(cands, kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(logits: &[f32], p: f32) -> Vec<u32> {
        let mut cands: Vec<Cand> = logits.iter().enumerate().map(|(i, &l)| Cand { id: i as u32, logit: l }).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        keep_typical(&mut cands, max, p, &mut Vec::new(), &mut Vec::new());
        cands.iter().map(|c| c.id).collect()
    }

    #[test]
    fn keeps_the_tokens_whose_surprise_is_near_the_entropy() {
        // p = [0.4, 0.3, 0.2, 0.1]: H ≈ 1.280, surprises 0.916, 1.204, 1.609, 2.303, so the distances rank the
        // tokens 1 (0.076), 2 (0.329), 0 (0.364), 3 (1.023).
        let l = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        assert_eq!(run(&l, 0.25), vec![1]);
        assert_eq!(run(&l, 0.45), vec![1, 2], "the most likely token is not the most typical");
        assert_eq!(run(&l, 0.55), vec![0, 1, 2]);
        // A dominant token far below the entropy's surprise is dropped when the tail is typical.
        let mut l = vec![0.0f32; 101];
        l[0] = 4.0; // p ≈ 0.35; the 100 others ≈ 0.0065 each
        let kept = run(&l, 0.5);
        assert!(!kept.contains(&0), "{kept:?}");
        assert!(kept.len() >= 76 && kept.len() <= 78, "{}", kept.len());
        assert_eq!(run(&l, 1e-6).len(), 1, "at least one token");
    }
}
