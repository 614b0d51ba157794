//! Rounding with error feedback (the method of GPTQ, Frantar et al. 2022), for `--calibrate`: the weights of a row
//! are rounded one column at a time, and each rounding error is spread over the columns not yet rounded in the way
//! that least disturbs the row's outputs on the calibration inputs. What counts is the whole Gram matrix
//! `H = E[xᵀx]` of the inputs, not only its diagonal (the columns' importance): errors in columns whose inputs move
//! together can cancel.
//!
//! With `U` the upper Cholesky factor of `H⁻¹` (`H⁻¹ = UᵀU`), rounding column `i` from `w` to `ŵ` updates the
//! later columns by `w[i+1..] -= (w − ŵ)/U[i][i] · U[i][i+1..]`. The columns are taken in order of decreasing
//! importance (GPTQ's "act order"), so that the large-input columns are rounded first and the small ones absorb
//! their errors. Each 32-column block's scale is chosen first, by the ordinary search (weighted by the diagonal) on
//! the original values, so the output is a standard block format.

use infer_kernels::quant::BlockQ4_0;
use infer_kernels::quant::q4_0::{QK4_0, quantize_row_search};
use infer_kernels::vec_f32::{axpy, dot};

/// Damping added to `H`'s diagonal, as a fraction of its mean (GPTQ's `percdamp`): keeps the factorisation stable
/// when some inputs are (nearly) never excited or move together.
const DAMP: f64 = 0.01;

/// `U`, the upper Cholesky factor of `(H + damping)⁻¹` for one matrix input of `n` columns.
#[derive(Debug, Clone)]
pub struct Factor {
    n: usize,
    /// The order the columns are rounded in: `perm[k]` is the k-th column.
    perm: Vec<usize>,
    /// Row-major `n × n`, of `H` with rows and columns in `perm`'s order; only `i <= j` is used.
    u: Vec<f32>,
}

impl Factor {
    /// From the Gram matrix `Σ xᵀx` over `rows` input rows (`n × n`, row-major), or `None` if it has no positive
    /// diagonal or is not positive definite even after damping.
    pub fn new(gram: &[f32], n: usize, rows: u64) -> Option<Factor> {
        assert_eq!(gram.len(), n * n, "a Gram matrix of {n} columns");
        let mean_diag = (0..n).map(|i| gram[i * n + i] as f64).sum::<f64>() / (n as f64 * rows.max(1) as f64);
        if !(mean_diag > 0.0 && mean_diag.is_finite()) {
            return None;
        }
        // H⁻¹ = UᵀU with U upper is, in reversed column order (J, the reversal), the product of a lower
        // triangular matrix and its transpose: with J·H·J = L·Lᵀ (Cholesky), U = J·L⁻¹·J.
        let inv_rows = 1.0 / rows.max(1) as f32;
        let damp = (DAMP * mean_diag) as f32;
        let mut perm: Vec<usize> = (0..n).collect();
        perm.sort_by(|&a, &b| gram[b * n + b].total_cmp(&gram[a * n + a]));
        let mut l = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..=i {
                l[i * n + j] = gram[perm[n - 1 - i] * n + perm[n - 1 - j]] * inv_rows;
            }
            l[i * n + i] += damp;
        }
        // Cholesky, row by row: L[i][j] = (A[i][j] − L[i][..j]·L[j][..j]) / L[j][j].
        for i in 0..n {
            let (done, rest) = l.split_at_mut(i * n);
            let row = &mut rest[..n];
            for j in 0..i {
                let lj = &done[j * n..j * n + j + 1];
                row[j] = (row[j] - dot(&row[..j], &lj[..j])) / lj[j];
            }
            let d = row[i] - dot(&row[..i], &row[..i]);
            if !(d > 0.0 && d.is_finite()) {
                return None;
            }
            row[i] = d.sqrt();
        }
        // L⁻¹, row by row: row i = (e_i − Σ_{k<i} L[i][k]·(row k of L⁻¹)) / L[i][i].
        let mut inv = vec![0f32; n * n];
        let mut y = vec![0f32; n];
        for i in 0..n {
            y[..=i].fill(0.0);
            y[i] = 1.0;
            for k in 0..i {
                let c = l[i * n + k];
                if c != 0.0 {
                    axpy(-c, &inv[k * n..k * n + k + 1], &mut y[..=k]);
                }
            }
            let s = 1.0 / l[i * n + i];
            for (o, &v) in inv[i * n..i * n + i + 1].iter_mut().zip(&y[..=i]) {
                *o = v * s;
            }
        }
        let mut u = vec![0f32; n * n];
        for i in 0..n {
            for j in i..n {
                u[i * n + j] = inv[(n - 1 - i) * n + (n - 1 - j)];
            }
        }
        Some(Factor { n, perm, u })
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

/// Quantizes rows of `f.n()` values to Q4_0 blocks in `out` (18 bytes per 32 values), rounding with error feedback;
/// `importance` (one per column) weighs each block's scale search.
pub fn quantize_q4_0_rows(x: &[f32], f: &Factor, importance: &[f32], out: &mut [u8]) {
    let n = f.n;
    assert!(n.is_multiple_of(QK4_0) && x.len().is_multiple_of(n) && importance.len() == n);
    let block_bytes = std::mem::size_of::<BlockQ4_0>();
    assert_eq!(out.len(), x.len() / QK4_0 * block_bytes);
    let mut blocks = vec![BlockQ4_0::default(); n / QK4_0];
    let (mut w, mut q) = (vec![0f32; n], vec![0u8; n]);
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n / QK4_0 * block_bytes)) {
        quantize_row_search(row, Some(importance), &mut blocks);
        for (wk, &i) in w.iter_mut().zip(&f.perm) {
            *wk = row[i];
        }
        for (k, &i) in f.perm.iter().enumerate() {
            let d = blocks[i / QK4_0].d.to_f32();
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let level = (w[k] * id).round_ties_even().clamp(-8.0, 7.0);
            q[i] = (level + 8.0) as u8;
            let uk = &f.u[k * n..(k + 1) * n];
            let err = (w[k] - d * level) / uk[k];
            if k + 1 < n {
                axpy(-err, &uk[k + 1..], &mut w[k + 1..]);
            }
        }
        for ((ob, b), qb) in o.chunks_exact_mut(block_bytes).zip(&blocks).zip(q.chunks_exact(QK4_0)) {
            ob[..2].copy_from_slice(&b.d.to_le_bytes());
            for j in 0..QK4_0 / 2 {
                ob[2 + j] = qb[j] | (qb[j + QK4_0 / 2] << 4);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn the_factor_inverts_the_damped_gram_matrix() {
        let (n, rows) = (64usize, 200usize);
        let mut seed = 1;
        let x: Vec<f32> = (0..n * rows).map(|_| lcg(&mut seed)).collect();
        let mut g = vec![0f32; n * n];
        for r in x.chunks_exact(n) {
            for a in 0..n {
                for b in 0..n {
                    g[a * n + b] += r[a] * r[b];
                }
            }
        }
        let f = Factor::new(&g, n, rows as u64).unwrap();
        let mean = (0..n).map(|i| g[i * n + i] as f64).sum::<f64>() / (n * rows) as f64;
        // (UᵀU)·H = I with H the damped mean Gram matrix.
        for a in 0..n {
            for b in 0..n {
                let mut s = 0f64;
                for k in 0..n {
                    let hinv_ak: f64 = (0..=a.min(k)).map(|m| f.u[m * n + a] as f64 * f.u[m * n + k] as f64).sum();
                    let (pk, pb) = (f.perm[k], f.perm[b]);
                    let h_kb = g[pk * n + pb] as f64 / rows as f64 + if k == b { DAMP * mean } else { 0.0 };
                    s += hinv_ak * h_kb;
                }
                let want = if a == b { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-3, "({a}, {b}): {s}");
            }
        }
    }

    #[test]
    fn error_feedback_lowers_the_output_error() {
        // Inputs with correlated columns: feedback should beat plain rounding on E[(x·(w − ŵ))²].
        let (n, rows, wrows) = (64usize, 400usize, 8usize);
        let mut seed = 9;
        let base: Vec<f32> = (0..rows * 4).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..rows * n).map(|i| base[(i / n) * 4 + (i % n) % 4] + 0.1 * lcg(&mut seed)).collect();
        let mut g = vec![0f32; n * n];
        for r in x.chunks_exact(n) {
            for a in 0..n {
                for b in 0..n {
                    g[a * n + b] += r[a] * r[b];
                }
            }
        }
        let imp: Vec<f32> = (0..n).map(|i| g[i * n + i] / rows as f32).collect();
        let w: Vec<f32> = (0..wrows * n).map(|_| lcg(&mut seed)).collect();
        let f = Factor::new(&g, n, rows as u64).unwrap();
        let mut fb = vec![0u8; wrows * n / 32 * 18];
        quantize_q4_0_rows(&w, &f, &imp, &mut fb);
        let mut plain = vec![BlockQ4_0::default(); wrows * n / 32];
        quantize_row_search(&w, Some(&imp), &mut plain);
        let deq = |bytes: &[u8]| {
            let mut y = vec![0f32; wrows * n];
            infer_kernels::dequantize(infer_kernels::GgmlType::Q4_0, bytes, &mut y).unwrap();
            y
        };
        let (y_fb, y_plain) = (deq(&fb), deq(infer_kernels::quant::blocks_as_bytes(&plain)));
        let out_err = |y: &[f32]| -> f64 {
            let mut e = 0f64;
            for xr in x.chunks_exact(n) {
                for (wr, yr) in w.chunks_exact(n).zip(y.chunks_exact(n)) {
                    let d: f32 = xr.iter().zip(wr.iter().zip(yr)).map(|(a, (p, q))| a * (p - q)).sum();
                    e += (d * d) as f64;
                }
            }
            e
        };
        let (e_fb, e_plain) = (out_err(&y_fb), out_err(&y_plain));
        assert!(e_fb < 0.8 * e_plain, "with feedback {e_fb} vs without {e_plain}");
    }
}
