//! The matmul drivers at the level chosen for this run (`INFER_ISA`): close to the f64 product of the dequantized
//! weights, rows of an m>1 product equal to the m=1 products, identical results on 1 and 2 threads, and
//! `matmul_multi` equal to separate calls.

use half::f16;
use infer_kernels::GgmlType;
use infer_kernels::matmul::{ActPrecision, MatmulError, MatmulScratch, WeightMatrix, matmul, matmul_multi};
use infer_kernels::parallel::for_each_row;
use infer_kernels::quant::{self, BlockQ2K, BlockQ4K, BlockQ6K, BlockQ8_0, QK_K, blocks_as_bytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q2_K,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

fn randv(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Quantizes random weights to `ty` and calls `f(bytes, dequantized)`.
fn with_weights<R>(ty: GgmlType, rows: usize, cols: usize, seed: u64, f: impl FnOnce(&[u8], &[f32]) -> R) -> R {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = randv(&mut rng, rows * cols);
    macro_rules! q {
        ($zero:expr, $module:ident) => {{
            let mut b = vec![$zero; rows * cols / ty.block_size()];
            quant::$module::quantize_row_ref(&x, &mut b);
            let bytes = blocks_as_bytes(&b);
            let mut deq = vec![0f32; rows * cols];
            infer_kernels::dequantize(ty, bytes, &mut deq).unwrap();
            f(bytes, &deq)
        }};
    }
    match ty {
        GgmlType::F32 => f(blocks_as_bytes(&x), &x),
        GgmlType::F16 => q!(f16::ZERO, f16),
        GgmlType::Q8_0 => q!(BlockQ8_0::default(), q8_0),
        GgmlType::Q4_0 => q!(quant::BlockQ4_0::default(), q4_0),
        GgmlType::Q4_1 => q!(quant::BlockQ4_1::default(), q4_1),
        GgmlType::Q5_0 => q!(quant::BlockQ5_0::default(), q5_0),
        GgmlType::Q2_K => q!(BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO }, q2_k),
        GgmlType::Q4_K => q!(BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] }, q4_k),
        GgmlType::Q6_K => q!(BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO }, q6_k),
        _ => unreachable!(),
    }
}

fn cols_for(ty: GgmlType, n_blocks: usize) -> usize {
    match ty.block_size() {
        1 => 32 * n_blocks + 5, // float weights take any length
        bs => bs * n_blocks,
    }
}

/// Largest error int8 activation quantization can cause: each x moves by at most half a step, max|x_block|/254.
fn act_error_bound(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let bs = if ty.block_size() == QK_K { QK_K } else { 32 };
    w.chunks(bs)
        .zip(x.chunks(bs))
        .map(|(wb, xb)| {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0
        })
        .sum()
}

#[test]
fn matmul_close_to_f64_reference_and_rows_independent() {
    for ty in TYPES {
        for n_blocks in [1, 3] {
            let cols = cols_for(ty, n_blocks);
            for rows in [1, 5, 13, 36] {
                with_weights(ty, rows, cols, rows as u64 * 31 + cols as u64, |bytes, deq| {
                    let w = WeightMatrix::new(ty, bytes, rows, cols).unwrap();
                    let mut rng = ChaCha8Rng::seed_from_u64(7);
                    for m in [1, 3, 7, 17] {
                        let x: Vec<f32> = randv(&mut rng, m * cols).iter().map(|v| v * 4.0).collect();
                        for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                            let mut s = MatmulScratch::new(prec);
                            let mut out = vec![f32::NAN; m * rows];
                            matmul(&w, &x, m, &mut out, &mut s);
                            for i in 0..m {
                                let xr = &x[i * cols..(i + 1) * cols];
                                let mut one = vec![f32::NAN; rows];
                                matmul(&w, xr, 1, &mut one, &mut s);
                                for j in 0..rows {
                                    let got = out[i * rows + j];
                                    assert_eq!(
                                        got.to_bits(),
                                        one[j].to_bits(),
                                        "{ty} {prec:?} m={m} row {i} differs from m=1"
                                    );
                                    let wr = &deq[j * cols..(j + 1) * cols];
                                    let want: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                                    let mag: f64 = wr.iter().zip(xr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                                    let act = match (ty, prec) {
                                        (GgmlType::F32 | GgmlType::F16, _) => 0.0,
                                        (_, ActPrecision::Q8) => act_error_bound(ty, wr, xr),
                                        (_, ActPrecision::Q8x2) => act_error_bound(ty, wr, xr) / 120.0,
                                    };
                                    let tol = act * 1.01 + 2e-5 * (1.0 + mag);
                                    assert!(
                                        (got as f64 - want).abs() <= tol,
                                        "{ty} {prec:?} rows={rows} cols={cols} m={m} ({i},{j}): {got} vs {want}, tol {tol}"
                                    );
                                }
                            }
                        }
                    }
                });
            }
        }
    }
}

#[test]
fn q8x2_is_much_more_accurate_than_q8() {
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let (rows, cols) = (64, 512);
        with_weights(ty, rows, cols, 99, |bytes, deq| {
            let w = WeightMatrix::new(ty, bytes, rows, cols).unwrap();
            let x = randv(&mut ChaCha8Rng::seed_from_u64(5), cols);
            let want: Vec<f64> = (0..rows)
                .map(|j| deq[j * cols..(j + 1) * cols].iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum())
                .collect();
            let err = |prec| {
                let mut out = vec![0f32; rows];
                matmul(&w, &x, 1, &mut out, &mut MatmulScratch::new(prec));
                out.iter().zip(&want).map(|(g, w)| (*g as f64 - w).powi(2)).sum::<f64>().sqrt()
            };
            let (e1, e2) = (err(ActPrecision::Q8), err(ActPrecision::Q8x2));
            let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
            eprintln!("{ty}: relative rms error vs f64: Q8 {:.2e}, Q8x2 {:.2e}", e1 / norm, e2 / norm);
            assert!(e2 * 20.0 < e1, "{ty}: Q8 rms error {e1}, Q8x2 {e2}");
        });
    }
}

#[test]
fn same_result_on_one_and_two_threads_and_multi_equals_single() {
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let pool2 = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for ty in TYPES {
        let cols = if ty.block_size() == QK_K { 512 } else { 576 };
        let (r1, r2) = (300, 158);
        with_weights(ty, r1, cols, 1, |b1, _| {
            with_weights(ty, r2, cols, 2, |b2, _| {
                let w1 = WeightMatrix::new(ty, b1, r1, cols).unwrap();
                let w2 = WeightMatrix::new(ty, b2, r2, cols).unwrap();
                // The last is a prompt that two threads also cut into chunks of activation rows.
                for m in [1, 5, 2 * infer_kernels::dispatch::kernels().task_rows + 5] {
                    let x = randv(&mut ChaCha8Rng::seed_from_u64(m as u64), m * cols);
                    for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                        let run = |pool: &rayon::ThreadPool| {
                            pool.install(|| {
                                let mut s = MatmulScratch::new(prec);
                                let (mut o1, mut o2) = (vec![f32::NAN; m * r1], vec![f32::NAN; m * r2]);
                                matmul_multi(&[&w1, &w2], &x, m, &mut [&mut o1, &mut o2], &mut s);
                                let mut s1 = vec![f32::NAN; m * r1];
                                matmul(&w1, &x, m, &mut s1, &mut s);
                                (o1, o2, s1)
                            })
                        };
                        let (a1, a2, as1) = run(&pool1);
                        let (b1, b2, bs1) = run(&pool2);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a1), bits(&b1), "{ty} {prec:?} m={m}: 1 vs 2 threads");
                        assert_eq!(bits(&a2), bits(&b2), "{ty} {prec:?} m={m}: 1 vs 2 threads");
                        assert_eq!(bits(&a1), bits(&as1), "{ty} {prec:?} m={m}: multi vs single");
                        assert_eq!(bits(&as1), bits(&bs1), "{ty} {prec:?} m={m}: single, 1 vs 2 threads");
                    }
                }
            })
        });
    }
}

#[test]
fn prequantized_rows_give_the_same_result_as_the_matmuls_own_pass() {
    // Quantizing rows in the producing pass (serially or in parallel) and then calling the matmul equals letting the
    // matmul quantize; matrices that do not take 32-block activations decline, and a prequantization for another
    // shape is ignored rather than used.
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in TYPES {
        let cols = if ty.block_size() == QK_K { 512 } else { 576 };
        let rows = 100;
        with_weights(ty, rows, cols, 7, |b, _| {
            let w = WeightMatrix::new(ty, b, rows, cols).unwrap();
            for m in [1, 3, 20] {
                let x = randv(&mut ChaCha8Rng::seed_from_u64(m as u64 + 40), m * cols);
                for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                    let mut s = MatmulScratch::new(prec);
                    let mut want = vec![f32::NAN; m * rows];
                    matmul(&w, &x, m, &mut want, &mut s);
                    for parallel in [false, true] {
                        let mut got = vec![f32::NAN; m * rows];
                        match s.prequantize(&[&w], &x, cols) {
                            Some(pre) => {
                                assert!(matches!(
                                    ty,
                                    GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0
                                ));
                                for_each_row(pre, parallel, |t, mut r| r.quantize(&x[t * cols..(t + 1) * cols]));
                            }
                            None => assert!(!matches!(
                                ty,
                                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0
                            )),
                        }
                        matmul(&w, &x, m, &mut got, &mut s);
                        assert_eq!(bits(&got), bits(&want), "{ty} {prec:?} m={m} parallel={parallel}");
                    }
                    // The call does use the prequantized rows: filled from other values, they give those values'
                    // product (which is how a caller must not use it, and how the test sees the skip).
                    if let Some(pre) = s.prequantize(&[&w], &x, cols) {
                        let y: Vec<f32> = x.iter().map(|v| 0.5 - v).collect();
                        for_each_row(pre, false, |t, mut r| r.quantize(&y[t * cols..(t + 1) * cols]));
                        let (mut got, mut want_y) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
                        matmul(&w, &x, m, &mut got, &mut s);
                        matmul(&w, &y, m, &mut want_y, &mut s);
                        assert_eq!(bits(&got), bits(&want_y), "{ty} {prec:?} m={m}: prequantized rows used");
                    }
                    // Prequantized for another buffer: the next call quantizes itself.
                    let other = vec![9.0f32; m * cols];
                    if let Some(pre) = s.prequantize(&[&w], &other, cols) {
                        for_each_row(pre, false, |t, mut r| r.quantize(&other[t * cols..(t + 1) * cols]));
                    }
                    let mut got = vec![f32::NAN; m * rows];
                    matmul(&w, &x, m, &mut got, &mut s);
                    assert_eq!(bits(&got), bits(&want), "{ty} {prec:?} m={m}: stale prequantization ignored");
                }
            }
        });
    }
}

#[test]
fn weight_matrix_checks_its_input() {
    let data = vec![0u8; 20 * 4];
    assert!(WeightMatrix::new(GgmlType::Q4_1, &data, 2, 64).is_ok());
    assert!(matches!(WeightMatrix::new(GgmlType::Q4_1, &data, 2, 48), Err(MatmulError::PartialBlock { .. })));
    assert!(matches!(WeightMatrix::new(GgmlType::Q4_1, &data, 3, 64), Err(MatmulError::Size { .. })));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q3_K, &data, 1, 256),
        Err(MatmulError::Size { .. } | MatmulError::Unsupported(_))
    ));
    let f = vec![0f32; 8];
    let bytes = blocks_as_bytes(&f);
    assert!(matches!(WeightMatrix::new(GgmlType::F32, &bytes[1..29], 1, 7), Err(MatmulError::Misaligned { .. })));
    let w = WeightMatrix::new(GgmlType::F32, &bytes[..28], 1, 7).unwrap();
    assert_eq!((w.rows(), w.cols(), w.ty()), (1, 7, GgmlType::F32));
}
