//! Tests of the block formats: quantize/dequantize error on ggml's standard test data, the scalar `_ref` dot
//! products against f32 arithmetic on the dequantized values, awkward sizes, degenerate blocks, and the checked
//! byte-level `dequantize` entry point.

use half::f16;
use infer_kernels::quant::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A random scale that is exactly representable as f16 (so the blocks are what a file could hold).
fn rand_f16(r: &mut ChaCha8Rng, lo: f32, hi: f32) -> f16 {
    f16::from_f32(r.random_range(lo..hi))
}

fn rand_q8_0(r: &mut ChaCha8Rng, n: usize) -> Vec<BlockQ8_0> {
    (0..n)
        .map(|_| {
            let mut b = BlockQ8_0 { d: rand_f16(r, -0.05, 0.05), qs: [0; 32] };
            b.qs.iter_mut().for_each(|q| *q = r.random_range(-127..=127));
            b
        })
        .collect()
}

fn rand_q8_k(r: &mut ChaCha8Rng, n: usize) -> Vec<BlockQ8K> {
    (0..n)
        .map(|_| {
            let mut b = BlockQ8K { d: r.random_range(-0.05..0.05), qs: [0; QK_K], bsums: [0; QK_K / 16] };
            b.qs.iter_mut().for_each(|q| *q = r.random_range(-127..=127));
            for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = qs.iter().map(|&q| q as i16).sum();
            }
            b
        })
        .collect()
}

fn rand_bytes<const N: usize>(r: &mut ChaCha8Rng) -> [u8; N] {
    let mut a = [0u8; N];
    r.fill(&mut a[..]);
    a
}

/// `Σ w_i a_i` in f64 over the dequantized values: what every `_ref` dot must equal up to f32 rounding.
fn f64_dot(w: &[f32], a: &[f32]) -> f64 {
    w.iter().zip(a).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn assert_close(got: f32, want: f64, scale: f64, what: &str) {
    let tol = 1e-5 * scale.max(1e-3);
    assert!((got as f64 - want).abs() <= tol, "{what}: got {got}, want {want} (tolerance {tol})");
}

/// Scale for the relative tolerance: `Σ |w_i a_i|`, the size of the terms being added.
fn abs_dot(w: &[f32], a: &[f32]) -> f64 {
    w.iter().zip(a).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum()
}

macro_rules! dot_matches_dequant {
    ($name:ident, $qk:expr, $make_w:expr, $make_a:expr, $deq_w:path, $deq_a:path, $dot:path) => {
        #[test]
        fn $name() {
            let mut r = rng(0x5eed);
            for nb in 1..=9 {
                let w: Vec<_> = (0..nb).map(|_| $make_w(&mut r)).collect();
                let a = $make_a(&mut r, nb);
                let (mut wf, mut af) = (vec![0.0f32; nb * $qk], vec![0.0f32; nb * $qk]);
                $deq_w(&w, &mut wf);
                $deq_a(&a, &mut af);
                let got = $dot(&w, &a);
                assert_close(got, f64_dot(&wf, &af), abs_dot(&wf, &af), stringify!($dot));
            }
        }
    };
}

dot_matches_dequant!(
    dot_q8_0_matches_dequant,
    32,
    |r: &mut ChaCha8Rng| rand_q8_0(r, 1)[0],
    rand_q8_0,
    q8_0::dequantize_row_ref,
    q8_0::dequantize_row_ref,
    q8_0::vec_dot_q8_0_q8_0_ref
);
dot_matches_dequant!(
    dot_q4_0_matches_dequant,
    32,
    |r: &mut ChaCha8Rng| BlockQ4_0 { d: rand_f16(r, -0.1, 0.1), qs: rand_bytes(r) },
    rand_q8_0,
    q4_0::dequantize_row_ref,
    q8_0::dequantize_row_ref,
    q4_0::vec_dot_q4_0_q8_0_ref
);
dot_matches_dequant!(
    dot_q4_1_matches_dequant,
    32,
    |r: &mut ChaCha8Rng| BlockQ4_1 { d: rand_f16(r, 0.0, 0.1), m: rand_f16(r, -1.0, 0.0), qs: rand_bytes(r) },
    rand_q8_0,
    q4_1::dequantize_row_ref,
    q8_0::dequantize_row_ref,
    q4_1::vec_dot_q4_1_q8_0_ref
);
dot_matches_dequant!(
    dot_q5_0_matches_dequant,
    32,
    |r: &mut ChaCha8Rng| BlockQ5_0 { d: rand_f16(r, -0.1, 0.1), qh: rand_bytes(r), qs: rand_bytes(r) },
    rand_q8_0,
    q5_0::dequantize_row_ref,
    q8_0::dequantize_row_ref,
    q5_0::vec_dot_q5_0_q8_0_ref
);
dot_matches_dequant!(
    dot_q2_k_matches_dequant,
    QK_K,
    |r: &mut ChaCha8Rng| BlockQ2K {
        scales: rand_bytes(r),
        qs: rand_bytes(r),
        d: rand_f16(r, 0.0, 0.01),
        dmin: rand_f16(r, 0.0, 0.01)
    },
    rand_q8_k,
    q2_k::dequantize_row_ref,
    q8_k::dequantize_row_ref,
    q2_k::vec_dot_q2_k_q8_k_ref
);
dot_matches_dequant!(
    dot_q4_k_matches_dequant,
    QK_K,
    |r: &mut ChaCha8Rng| BlockQ4K {
        d: rand_f16(r, 0.0, 0.01),
        dmin: rand_f16(r, 0.0, 0.01),
        scales: rand_bytes(r),
        qs: rand_bytes(r)
    },
    rand_q8_k,
    q4_k::dequantize_row_ref,
    q8_k::dequantize_row_ref,
    q4_k::vec_dot_q4_k_q8_k_ref
);
dot_matches_dequant!(
    dot_q6_k_matches_dequant,
    QK_K,
    |r: &mut ChaCha8Rng| BlockQ6K {
        ql: rand_bytes(r),
        qh: rand_bytes(r),
        scales: rand_bytes::<16>(r).map(|b| b as i8),
        d: rand_f16(r, -0.01, 0.01)
    },
    rand_q8_k,
    q6_k::dequantize_row_ref,
    q8_k::dequantize_row_ref,
    q6_k::vec_dot_q6_k_q8_k_ref
);
