//! `cargo bench -p infer-kernels --bench matmul [-- quick]`: decode matvec GB/s and prefill GOP/s per weight format
//! and instruction-set level on the real SmolLM2-135M shapes (Gemma-3-like shapes for the K-quants, whose rows must
//! be multiples of 256), next to the machine's measured memory bandwidth.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use infer_kernels::GgmlType;
use infer_kernels::dispatch::{Isa, Kernels};
use infer_kernels::matmul::{ActPrecision, MatmulScratch, WeightMatrix, matmul_multi_with};
use infer_kernels::quant::{self, BlockQ2K, BlockQ4K, BlockQ6K, BlockQ8_0, blocks_as_bytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Quantized random weights, kept as typed blocks so the bytes are aligned.
enum Owned {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<quant::BlockQ4_0>),
    Q4_1(Vec<quant::BlockQ4_1>),
    Q5_0(Vec<quant::BlockQ5_0>),
    Q2K(Vec<BlockQ2K>),
    Q4K(Vec<BlockQ4K>),
    Q6K(Vec<BlockQ6K>),
}

impl Owned {
    fn new(ty: GgmlType, rows: usize, cols: usize) -> Owned {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let n = rows * cols / ty.block_size();
        macro_rules! q {
            ($v:ident, $zero:expr, $m:ident) => {{
                let mut b = vec![$zero; n];
                quant::$m::quantize_row_ref(&x, &mut b);
                Owned::$v(b)
            }};
        }
        match ty {
            GgmlType::F32 => Owned::F32(x),
            GgmlType::F16 => q!(F16, f16::ZERO, f16),
            GgmlType::Q8_0 => q!(Q8_0, BlockQ8_0::default(), q8_0),
            GgmlType::Q4_0 => q!(Q4_0, quant::BlockQ4_0::default(), q4_0),
            GgmlType::Q4_1 => q!(Q4_1, quant::BlockQ4_1::default(), q4_1),
            GgmlType::Q5_0 => q!(Q5_0, quant::BlockQ5_0::default(), q5_0),
            GgmlType::Q2_K => q!(Q2K, BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO }, q2_k),
            GgmlType::Q4_K => q!(Q4K, BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] }, q4_k),
            GgmlType::Q6_K => q!(Q6K, BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO }, q6_k),
            _ => unreachable!(),
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Owned::F32(v) => blocks_as_bytes(v),
            Owned::F16(v) => blocks_as_bytes(v),
            Owned::Q8_0(v) => blocks_as_bytes(v),
            Owned::Q4_0(v) => blocks_as_bytes(v),
            Owned::Q4_1(v) => blocks_as_bytes(v),
            Owned::Q5_0(v) => blocks_as_bytes(v),
            Owned::Q2K(v) => blocks_as_bytes(v),
            Owned::Q4K(v) => blocks_as_bytes(v),
            Owned::Q6K(v) => blocks_as_bytes(v),
        }
    }
}

/// Best time per call: repeat batches until `budget` is spent, keep the fastest batch average.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut batch = 1;
    while start.elapsed() < budget {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        let per = t.elapsed().as_secs_f64() / batch as f64;
        best = best.min(per);
        if per * (batch as f64) < 0.01 {
            batch *= 2;
        }
    }
    best
}

fn memory_bandwidth(pool: &rayon::ThreadPool, budget: Duration) -> (f64, f64, f64) {
    use rayon::prelude::*;
    let n = 64 << 20; // 512 MiB of u64
    let src: Vec<u64> = (0..n as u64).collect();
    let mut dst = vec![0u64; n];
    let bytes = (n * 8) as f64;
    let read1 = time(budget, || {
        black_box(src.iter().fold(0u64, |a, &v| a.wrapping_add(v)));
    });
    let read2 = pool.install(|| {
        time(budget, || {
            black_box(src.par_chunks(n / 16).map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v))).sum::<u64>());
        })
    });
    let copy = pool.install(|| {
        time(budget, || {
            dst.par_chunks_mut(n / 16).zip(src.par_chunks(n / 16)).for_each(|(d, s)| d.copy_from_slice(s));
            black_box(&dst);
        })
    });
    (bytes / read1 / 1e9, bytes / read2 / 1e9, 2.0 * bytes / copy / 1e9)
}

struct Case {
    ty: GgmlType,
    shapes: &'static [(usize, usize)],
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let budget = Duration::from_millis(if quick { 150 } else { 600 });
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();

    let (r1, r2, cp) = memory_bandwidth(&pool, budget);
    println!("memory: read {r1:.1} GB/s (1 thread), {r2:.1} GB/s ({threads} threads); copy {cp:.1} GB/s (read+write)");
    println!();

    const SMOL: &[(usize, usize)] = &[(576, 576), (1536, 576), (576, 1536), (49152, 576)];
    const KSH: &[(usize, usize)] = &[(576, 1536), (1152, 6912), (6912, 1024)];
    let cases = [
        Case { ty: GgmlType::Q4_1, shapes: SMOL },
        Case { ty: GgmlType::Q8_0, shapes: SMOL },
        Case { ty: GgmlType::F32, shapes: SMOL },
        Case { ty: GgmlType::F16, shapes: SMOL },
        Case { ty: GgmlType::Q4_0, shapes: SMOL },
        Case { ty: GgmlType::Q5_0, shapes: SMOL },
        Case { ty: GgmlType::Q4_K, shapes: KSH },
        Case { ty: GgmlType::Q6_K, shapes: KSH },
        Case { ty: GgmlType::Q2_K, shapes: KSH },
    ];
    let filter: Option<String> = std::env::args().skip(1).find(|a| a != "quick" && a != "--bench");
    let m_prefill = 512;
    println!(
        "{:<6} {:<7} {:>11} {:>9} {:>11} {:>11} {:>11} {:>11} {:>8}",
        "type", "isa", "rows×cols", "MB", "dec GB/s", "dec1t GB/s", "pf GOP/s", "pf x2 GOP/s", "b16/b1"
    );
    for case in &cases {
        if let Some(f) = &filter {
            if !case.ty.name().eq_ignore_ascii_case(f) {
                continue;
            }
        }
        for &(rows, cols) in case.shapes {
            let owned = Owned::new(case.ty, rows, cols);
            let w = WeightMatrix::new(case.ty, owned.bytes(), rows, cols).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(2);
            let x: Vec<f32> = (0..m_prefill * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut out = vec![0f32; m_prefill * rows];
            for isa in Isa::available() {
                let k: &Kernels = isa.kernels().unwrap();
                let mut run = |pool: &rayon::ThreadPool, m: usize, prec: ActPrecision, budget: Duration| {
                    let mut s = MatmulScratch::new(prec);
                    pool.install(|| {
                        time(budget, || matmul_multi_with(k, &[&w], &x[..m * cols], m, &mut [&mut out[..m * rows]], &mut s))
                    })
                };
                let dec = run(&pool, 1, ActPrecision::Q8, budget);
                let dec1 = run(&pool1, 1, ActPrecision::Q8, budget);
                let b16 = run(&pool, 16, ActPrecision::Q8, budget);
                let big = rows * cols > 10_000_000;
                let skip_pf = isa == Isa::Scalar && (big || quick);
                let (pf, pf2) = if skip_pf {
                    (f64::NAN, f64::NAN)
                } else {
                    let mpf = if big { 128 } else { m_prefill };
                    let ops = 2.0 * (mpf * rows * cols) as f64;
                    let t1 = run(&pool, mpf, ActPrecision::Q8, budget);
                    let t2 = if case.ty.block_size() == 1 { f64::NAN } else { run(&pool, mpf, ActPrecision::Q8x2, budget) };
                    (ops / t1 / 1e9, ops / t2 / 1e9)
                };
                let mb = w.bytes() as f64 / 1e6;
                println!(
                    "{:<6} {:<7} {:>11} {:>9.2} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>8.2}",
                    case.ty.name(),
                    isa.name(),
                    format!("{rows}×{cols}"),
                    mb,
                    w.bytes() as f64 / dec / 1e9,
                    w.bytes() as f64 / dec1 / 1e9,
                    pf,
                    pf2,
                    16.0 * dec / b16,
                );
            }
        }
    }
}
