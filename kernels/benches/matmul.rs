//! `cargo bench -p infer-kernels --bench matmul [-- quick]`: decode matvec GB/s and prefill GOP/s per weight format
//! and instruction-set level on the real SmolLM2-135M shapes (Gemma-3-like shapes for the K-quants, whose rows must
//! be multiples of 256), next to the machine's measured memory bandwidth.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use infer_kernels::GgmlType;
use infer_kernels::dispatch::{Isa, Kernels};
use infer_kernels::matmul::{ActPrecision, MatmulScratch, WeightMatrix, matmul_multi_with};
use infer_kernels::packed::{self, PackedMatrix};
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
    fn clone_owned(&self) -> Owned {
        match self {
            Owned::F32(v) => Owned::F32(v.clone()),
            Owned::F16(v) => Owned::F16(v.clone()),
            Owned::Q8_0(v) => Owned::Q8_0(v.clone()),
            Owned::Q4_0(v) => Owned::Q4_0(v.clone()),
            Owned::Q4_1(v) => Owned::Q4_1(v.clone()),
            Owned::Q5_0(v) => Owned::Q5_0(v.clone()),
            Owned::Q2K(v) => Owned::Q2K(v.clone()),
            Owned::Q4K(v) => Owned::Q4K(v.clone()),
            Owned::Q6K(v) => Owned::Q6K(v.clone()),
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

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), or `None` where unavailable. On a loaded machine
/// this measures the work itself; wall time measures the work plus waiting for a core.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// (best wall seconds per call, CPU seconds of this thread per call): batches are repeated until `budget` is spent;
/// wall time keeps the fastest batch, CPU time is the total over all batches (the kernel's schedstat clock only
/// advances at scheduler ticks, so short batches cannot be timed one by one). CPU time is only meaningful for
/// single-threaded runs.
fn time2(budget: Duration, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let start = Instant::now();
    let c0 = thread_cpu_ns();
    let mut best = f64::MAX;
    let mut calls = 0u64;
    let mut batch = 1;
    while start.elapsed() < budget {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        calls += batch;
        let per = t.elapsed().as_secs_f64() / batch as f64;
        best = best.min(per);
        if per * (batch as f64) < 0.02 {
            batch *= 2;
        }
    }
    let cpu = match (c0, thread_cpu_ns()) {
        (Some(a), Some(b)) => (b - a) as f64 * 1e-9 / calls as f64,
        _ => best,
    };
    (best, cpu)
}

fn time(budget: Duration, f: impl FnMut()) -> f64 {
    time2(budget, f).0
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

/// One SmolLM2-135M layer's matrices (rows × cols): q, k, v, o, gate, up, down.
const SMOLLM2_LAYER: [(usize, usize); 7] =
    [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)];

/// SmolLM2's 30 layers of `ty` weights (distinct copies, so that they stream from memory as in the model), and
/// the same layers repacked into panels.
fn smollm2_layers(ty: GgmlType) -> (Vec<Vec<Owned>>, Vec<Vec<PackedMatrix>>) {
    let layer: Vec<Owned> = SMOLLM2_LAYER.iter().map(|&(r, c)| Owned::new(ty, r, c)).collect();
    let layers: Vec<Vec<Owned>> = (0..30).map(|_| layer.iter().map(Owned::clone_owned).collect()).collect();
    let packs = layers
        .iter()
        .map(|l| l.iter().zip(SMOLLM2_LAYER).map(|(o, (r, c))| packed::pack(ty, o.bytes(), r, c).unwrap()).collect())
        .collect();
    (layers, packs)
}

/// SmolLM2-135M's per-token matmuls (30 layers: q/k/v 576→576/192/192, o 576→576, gate/up 576→1536, down
/// 1536→576) with every layer's weights in their own memory (≈66 MB in Q4_1, more than the L3), as the model runs
/// them: q/k/v and gate/up through `matmul_multi`; with `packs`, the weights repacked into panels. Returns (wall s,
/// CPU s of this thread) per call for `m` tokens.
#[allow(clippy::too_many_arguments)]
fn smollm2_sweep(
    k: &Kernels,
    layers: &[Vec<Owned>],
    packs: Option<&[Vec<PackedMatrix>]>,
    ty: GgmlType,
    pool: &rayon::ThreadPool,
    m: usize,
    prec: ActPrecision,
    budget: Duration,
) -> (f64, f64) {
    let ws: Vec<Vec<WeightMatrix>> = match packs {
        Some(p) => p.iter().map(|l| l.iter().map(WeightMatrix::packed).collect()).collect(),
        None => layers
            .iter()
            .map(|l| {
                l.iter().zip(SMOLLM2_LAYER).map(|(o, (r, c))| WeightMatrix::new(ty, o.bytes(), r, c).unwrap()).collect()
            })
            .collect(),
    };
    let x = vec![0.5f32; m * 576];
    let xi = vec![0.25f32; m * 1536];
    let (mut q, mut kk, mut v, mut o) =
        (vec![0f32; m * 576], vec![0f32; m * 192], vec![0f32; m * 192], vec![0f32; m * 576]);
    let (mut g, mut u, mut d) = (vec![0f32; m * 1536], vec![0f32; m * 1536], vec![0f32; m * 576]);
    let mut s = MatmulScratch::new(prec);
    pool.install(|| {
        time2(budget, || {
            for l in &ws {
                matmul_multi_with(k, &[&l[0], &l[1], &l[2]], &x, m, &mut [&mut q, &mut kk, &mut v], &mut s);
                matmul_multi_with(k, &[&l[3]], &q, m, &mut [&mut o], &mut s);
                matmul_multi_with(k, &[&l[4], &l[5]], &x, m, &mut [&mut g, &mut u], &mut s);
                matmul_multi_with(k, &[&l[6]], &xi, m, &mut [&mut d], &mut s);
            }
        })
    })
}

struct Case {
    ty: GgmlType,
    shapes: &'static [(usize, usize)],
}

fn filter_arg() -> Option<String> {
    std::env::args().skip(1).find(|a| a != "quick" && a != "--bench")
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

    // Fork/join cost: an empty two-task parallel region, back to back and after the workers fell asleep; and a
    // small decode matmul (k/v projection, 192×576 Q4_1, 69 KB) on 1 and on all threads.
    if filter_arg().as_deref().is_none_or(|f| f.eq_ignore_ascii_case("forkjoin")) {
        use rayon::prelude::*;
        let empty = || {
            (0..threads).into_par_iter().with_max_len(1).for_each(|t| {
                black_box(t);
            })
        };
        let hot = pool.install(|| time(budget, empty));
        let cold = pool.install(|| {
            let mut best = f64::MAX;
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(5));
                let t = Instant::now();
                empty();
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        });
        let owned = Owned::new(GgmlType::Q4_1, 192, 576);
        let w = WeightMatrix::new(GgmlType::Q4_1, owned.bytes(), 192, 576).unwrap();
        let x = vec![0.5f32; 576];
        let mut out = vec![0f32; 192];
        let k = Isa::best().kernels().unwrap();
        let mut mm = |p: &rayon::ThreadPool| {
            let mut s = MatmulScratch::new(ActPrecision::Q8);
            p.install(|| time(budget, || matmul_multi_with(k, &[&w], &x, 1, &mut [&mut out], &mut s)))
        };
        let (t1, t2) = (mm(&pool1), mm(&pool));
        println!(
            "fork/join ({threads} threads): {:.0} ns back to back, {:.1} µs after 5 ms idle; 192×576 Q4_1 matvec: {:.1} µs on 1 thread, {:.1} µs on {threads}",
            hot * 1e9,
            cold * 1e6,
            t1 * 1e6,
            t2 * 1e6
        );
        println!();
    }

    // Activation quantization: ns per value, single thread.
    if filter_arg().as_deref().is_none_or(|f| f.eq_ignore_ascii_case("quant")) {
        let x: Vec<f32> = (0..576 * 64).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        for isa in Isa::available() {
            let k = isa.kernels().unwrap();
            let mut line = format!("quantize {:<7}", isa.name());
            for g in [1, 2] {
                let (mut q, mut d, mut sv, mut i) =
                    (vec![0i8; 2 * 576], vec![0f32; 36], vec![0f32; 36], vec![0i32; 36]);
                let t = time2(budget, || {
                    for row in x.chunks(576) {
                        (k.quantize32)(
                            row,
                            g,
                            &mut q[..g * 576],
                            &mut d[..g * 18],
                            &mut sv[..g * 18],
                            &mut i[..g * 18],
                        );
                    }
                    black_box(&q);
                })
                .1;
                line += &format!("  32-blocks x{g}: {:.2} ns/value", t / x.len() as f64 * 1e9);
            }
            let mut kb = vec![infer_kernels::quant::BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }; 2 * 3];
            let xk = &x[..768 * 48];
            let t = time2(budget, || {
                for row in xk.chunks(768) {
                    (k.quantize_k)(row, 1, &mut kb[..3]);
                }
                black_box(&kb);
            })
            .1;
            line += &format!("  Q8_K: {:.2} ns/value", t / xk.len() as f64 * 1e9);
            println!("{line}");
        }
        println!();
    }

    // The batching curve of the panel kernel alone: SmolLM2's 30 Q4_1 layers at 1 to 16 tokens, single thread,
    // tokens per CPU-second, medians of 5 rounds that visit every token count in turn (so that a slow spell of a
    // shared machine spreads over all of them). Where the kernel changes tile shape with the batch, a dip shows.
    if filter_arg().as_deref().is_some_and(|f| f.eq_ignore_ascii_case("curve")) {
        let k = Isa::best().kernels().unwrap();
        let (layers, packs) = smollm2_layers(GgmlType::Q4_1);
        let ms = [1usize, 2, 3, 4, 6, 8, 12, 16];
        let precs = [ActPrecision::Q8x2, ActPrecision::Q8];
        let mut rates = vec![vec![Vec::new(); ms.len()]; precs.len()];
        for _round in 0..5 {
            for (mi, &m) in ms.iter().enumerate() {
                for (pi, &prec) in precs.iter().enumerate() {
                    let cpu = smollm2_sweep(k, &layers, Some(&packs), GgmlType::Q4_1, &pool1, m, prec, budget).1;
                    rates[pi][mi].push(m as f64 / cpu);
                }
            }
        }
        println!("batching curve, {} panels, SmolLM2 Q4_1 layers, 1 thread: tokens per CPU-second", Isa::best().name());
        println!("  {:<6}{}", "tokens", ms.iter().map(|m| format!("{m:>7}")).collect::<String>());
        for (pi, prec) in precs.iter().enumerate() {
            let medians = rates[pi].iter_mut().map(|r| {
                r.sort_by(f64::total_cmp);
                format!("{:>7.0}", r[r.len() / 2])
            });
            println!("  {:<6}{}", format!("{prec:?}"), medians.collect::<String>());
        }
        return;
    }

    // Batched decode on the panel kernel alone: SmolLM2's 30 Q4_1 layers and its Q8_0 lm_head (49152×576) at 16
    // tokens, single thread, tokens per CPU-second (CPU time is what a neighbour on a shared machine cannot
    // steal). Five rounds, so that the spread is visible next to any difference being measured.
    if filter_arg().as_deref().is_some_and(|f| f.eq_ignore_ascii_case("batched")) {
        let k = Isa::best().kernels().unwrap();
        let (layers, packs) = smollm2_layers(GgmlType::Q4_1);
        let head = Owned::new(GgmlType::Q8_0, 49152, 576);
        let head_pack = packed::pack(GgmlType::Q8_0, head.bytes(), 49152, 576).unwrap();
        let hw = WeightMatrix::packed(&head_pack);
        let m = 16;
        let x = vec![0.5f32; m * 576];
        let mut logits = vec![0f32; m * 49152];
        println!("batched decode, {} panels, 16 tokens, 1 thread: tokens per CPU-second", Isa::best().name());
        println!("  {:<6} {:>10} {:>10} {:>10} {:>10}", "round", "layers q8", "layers x2", "lm_head q8", "lm_head x2");
        for round in 1..=5 {
            let mut line = format!("  {round:<6}");
            for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                let cpu = smollm2_sweep(k, &layers, Some(&packs), GgmlType::Q4_1, &pool1, m, prec, budget).1;
                line += &format!(" {:>10.0}", m as f64 / cpu);
            }
            for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                let mut s = MatmulScratch::new(prec);
                let cpu = pool1
                    .install(|| time2(budget, || matmul_multi_with(k, &[&hw], &x, m, &mut [&mut logits], &mut s)))
                    .1;
                line += &format!(" {:>10.0}", m as f64 / cpu);
            }
            println!("{line}");
        }
        // The kernel's rate where memory is no limit: one L2-resident matrix, in vpdpbusd per CPU-second. One core
        // of the development machine (Zen 5) retires 8.5-8.6 G/s of them back to back, and FMAs share those pipes.
        let o = Owned::new(GgmlType::Q4_1, 1536, 576);
        let pk = packed::pack(GgmlType::Q4_1, o.bytes(), 1536, 576).unwrap();
        let w = WeightMatrix::packed(&pk);
        let mut out = vec![0f32; m * 1536];
        let mut line = "  L2-resident 1536×576 Q4_1, 16 tokens, G vpdpbusd/s:".to_string();
        for (prec, g) in [(ActPrecision::Q8, 1), (ActPrecision::Q8x2, 2)] {
            let mut s = MatmulScratch::new(prec);
            let cpu = pool1.install(|| time2(budget, || matmul_multi_with(k, &[&w], &x, m, &mut [&mut out], &mut s))).1;
            line += &format!(" {prec:?} {:.2}", (m * 1536 * 576 * g) as f64 / 64.0 / cpu / 1e9);
        }
        println!("{line}");
        return;
    }

    // Whole-model sweeps first: the numbers that predict tokens/s.
    if filter_arg().as_deref().is_none_or(|f| f.eq_ignore_ascii_case("smollm2")) {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (layers, packs) = smollm2_layers(ty);
            let mb: f64 = layers.iter().flatten().map(|o| o.bytes().len() as f64).sum::<f64>() / 1e6;
            println!("SmolLM2-135M matmuls, {ty} weights ({mb:.0} MB, 30 layers; no attention, no lm_head): tokens/s");
            println!("  (x2: Q8x2 activations; +panels: weights repacked into 16-row panels)");
            println!(
                "  {:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}",
                "isa", "decode", "dec x2", "b16", "b16 x2", "pf", "pf x2", "decode", "dec x2", "b16 x2", "b16/dec"
            );
            println!("  {:<14} single thread, tokens per CPU-second{:17}| {threads} threads, wall clock", "", "");
            let variants = Isa::available().into_iter().flat_map(|isa| {
                let k = isa.kernels().unwrap();
                let p = k.packed.is_some().then_some((isa, true));
                [Some((isa, false)), p].into_iter().flatten()
            });
            for (isa, use_packs) in variants {
                let k = isa.kernels().unwrap();
                let pk = use_packs.then_some(&packs[..]);
                let sw = |pool: &rayon::ThreadPool, m: usize, prec: ActPrecision| {
                    let (w, c) = smollm2_sweep(k, &layers, pk, ty, pool, m, prec, budget);
                    (m as f64 / w, m as f64 / c)
                };
                let (q8, x2) = (ActPrecision::Q8, ActPrecision::Q8x2);
                let d1 = sw(&pool1, 1, q8).1;
                let dx1 = sw(&pool1, 1, x2).1;
                let b1 = sw(&pool1, 16, q8).1;
                let bx1 = sw(&pool1, 16, x2).1;
                let (p1, px, d2, dx2, bx2) = if isa == Isa::Scalar {
                    (f64::NAN, f64::NAN, sw(&pool, 1, q8).0, f64::NAN, f64::NAN)
                } else {
                    (
                        sw(&pool1, 128, q8).1,
                        sw(&pool1, 128, x2).1,
                        sw(&pool, 1, q8).0,
                        sw(&pool, 1, x2).0,
                        sw(&pool, 16, x2).0,
                    )
                };
                println!(
                    "  {:<14} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} | {:>8.0} {:>8.0} {:>8.0} {:>8.2}",
                    format!("{}{}", isa.name(), if use_packs { "+panels" } else { "" }),
                    d1,
                    dx1,
                    b1,
                    bx1,
                    p1,
                    px,
                    d2,
                    dx2,
                    bx2,
                    bx2 / dx2
                );
            }
            println!();
        }
    }

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
    let filter = filter_arg();
    let m_prefill = 512;
    println!(
        "{:<6} {:<8} {:>11} {:>7} | {:>9} {:>9} {:>9} {:>9} {:>8} | {:>9} {:>9}",
        "type",
        "isa",
        "rows×cols",
        "MB",
        "dec GB/s",
        "pf GOP/s",
        "pfx2 GOP",
        "b16 GOP/s",
        "b16/b1",
        "dec2 GB/s",
        "pf2 GOP/s"
    );
    println!("{:38}| single thread, per CPU-second                      | {threads} threads, wall clock", "");
    for case in &cases {
        if filter.as_ref().is_some_and(|f| !case.ty.name().eq_ignore_ascii_case(f)) {
            continue;
        }
        for &(rows, cols) in case.shapes {
            let owned = Owned::new(case.ty, rows, cols);
            let gguf = WeightMatrix::new(case.ty, owned.bytes(), rows, cols).unwrap();
            let pack = packed::pack(case.ty, owned.bytes(), rows, cols);
            let mut rng = ChaCha8Rng::seed_from_u64(2);
            let x: Vec<f32> = (0..m_prefill * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let mut out = vec![0f32; m_prefill * rows];
            // Every level on the GGUF layout, then the levels with a panel kernel on the repacked matrix.
            let variants = Isa::available().into_iter().map(|i| (i, false)).chain(
                Isa::available()
                    .into_iter()
                    .filter(|i| pack.is_some() && i.kernels().unwrap().packed.is_some())
                    .map(|i| (i, true)),
            );
            for (isa, use_pack) in variants {
                let w = match (&pack, use_pack) {
                    (Some(p), true) => WeightMatrix::packed(p),
                    _ => gguf,
                };
                let k: &Kernels = isa.kernels().unwrap();
                let mut run = |pool: &rayon::ThreadPool, m: usize, prec: ActPrecision, budget: Duration| {
                    let mut s = MatmulScratch::new(prec);
                    pool.install(|| {
                        time2(budget, || {
                            matmul_multi_with(k, &[&w], &x[..m * cols], m, &mut [&mut out[..m * rows]], &mut s)
                        })
                    })
                };
                let big = rows * cols > 10_000_000;
                let mpf = if big { 64 } else { m_prefill };
                let ops = |m: usize| 2.0 * (m * rows * cols) as f64;
                let skip_pf = isa == Isa::Scalar && (big || quick);
                let bytes = w.bytes() as f64;
                let dec1 = run(&pool1, 1, ActPrecision::Q8, budget).1;
                let b16 = run(&pool1, 16, ActPrecision::Q8, budget).1;
                let dec2 = run(&pool, 1, ActPrecision::Q8, budget).0;
                let (pf1, pfx2, pf2) = if skip_pf {
                    (f64::NAN, f64::NAN, f64::NAN)
                } else {
                    let t1 = run(&pool1, mpf, ActPrecision::Q8, budget).1;
                    let tx2 = if case.ty.block_size() == 1 {
                        f64::NAN
                    } else {
                        run(&pool1, mpf, ActPrecision::Q8x2, budget).1
                    };
                    let t2 = run(&pool, mpf, ActPrecision::Q8, budget).0;
                    (ops(mpf) / t1 / 1e9, ops(mpf) / tx2 / 1e9, ops(mpf) / t2 / 1e9)
                };
                println!(
                    "{:<6} {:<8} {:>11} {:>7.2} | {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.2} | {:>9.1} {:>9.1}",
                    case.ty.name(),
                    format!("{}{}", isa.name(), if use_pack { "+p" } else { "" }),
                    format!("{rows}×{cols}"),
                    bytes / 1e6,
                    bytes / dec1 / 1e9,
                    pf1,
                    pfx2,
                    ops(16) / b16 / 1e9,
                    16.0 * dec1 / b16,
                    bytes / dec2 / 1e9,
                    pf2,
                );
            }
        }
    }
}
