//! Every kernel of every level this CPU has (`Isa::available()`) against K1's scalar `_ref` definitions, on random
//! data at awkward sizes; and every panel (tile) against the 1×1 vector dot of the same level, exactly.

use half::f16;
use infer_kernels::dispatch::{Act32, Isa, Kernels, OutSink, act32_from_q8_0, quantize_row32};
use infer_kernels::quant::{self, BlockQ8_0, BlockQ8K, QK_K};
use infer_kernels::vec_f32::{self, AxpyRows, SoftmaxState};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The levels this CPU has; each test that loops over them runs every one. `levels_report` says which ran.
fn levels() -> Vec<&'static Kernels> {
    Isa::available().into_iter().map(|i| i.kernels().unwrap()).collect()
}

/// Says which SIMD levels the kernel tests here exercise and which they cannot (the CPU lacks them), so that a
/// machine without AVX-512 reports its AVX-512 tests as not run rather than as passed. .ci/run prints it
/// (`cargo test -p infer-kernels --test simd levels_report -- --nocapture`).
#[test]
fn levels_report() {
    let (ran, missing): (Vec<Isa>, Vec<Isa>) = Isa::ALL.into_iter().partition(|i| i.is_supported());
    let names = |v: &[Isa]| v.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ");
    println!("SIMD kernel tests exercise: {}", names(&ran));
    if missing.is_empty() {
        println!("SIMD kernel tests not run: none");
    } else {
        println!("SIMD kernel tests NOT RUN (this CPU lacks the level): {}", names(&missing));
    }
    assert_eq!(levels().len(), ran.len());
}

fn randv(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect()
}

/// Owned Act32 buffers for one or more rows.
#[derive(Default)]
struct A32 {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    isum: Vec<i32>,
}
impl A32 {
    fn push(&mut self, blocks: &[BlockQ8_0]) {
        let (mut q, mut d, mut s, mut i) = (vec![], vec![], vec![], vec![]);
        act32_from_q8_0(blocks, &mut q, &mut d, &mut s, &mut i);
        self.qs.extend(q);
        self.d.extend(d);
        self.s.extend(s);
        self.isum.extend(i);
    }
    /// High + residual pairs (`quantize_row32`, group 2) of each `cols`-long row of `xs`.
    fn pairs(xs: &[f32], cols: usize) -> A32 {
        let mut a = A32::default();
        for x in xs.chunks(cols) {
            let nb = cols / 32;
            let (mut q, mut d, mut s, mut i) =
                (vec![0; 2 * cols], vec![0.0; 2 * nb], vec![0.0; 2 * nb], vec![0; 2 * nb]);
            quantize_row32(x, 2, &mut q, &mut d, &mut s, &mut i);
            a.qs.extend(q);
            a.d.extend(d);
            a.s.extend(s);
            a.isum.extend(i);
        }
        a
    }
    /// A copy of rows `first..first + n` (of `nb` blocks).
    fn rows(&self, first: usize, n: usize, nb: usize) -> A32 {
        let (q, b) = (first * nb * 32..(first + n) * nb * 32, first * nb..(first + n) * nb);
        A32 {
            qs: self.qs[q].to_vec(),
            d: self.d[b.clone()].to_vec(),
            s: self.s[b.clone()].to_vec(),
            isum: self.isum[b].to_vec(),
        }
    }
    fn view(&self) -> Act32<'_> {
        Act32 { qs: &self.qs, d: &self.d, s: &self.s, isum: &self.isum }
    }
}

fn q8_0_row(rng: &mut ChaCha8Rng, nb: usize) -> Vec<BlockQ8_0> {
    let x = randv(rng, nb * 32, 3.0);
    let mut b = vec![BlockQ8_0::default(); nb];
    quant::q8_0::quantize_row_ref(&x, &mut b);
    b
}

fn q8_k_row(rng: &mut ChaCha8Rng, nb: usize) -> Vec<BlockQ8K> {
    let x = randv(rng, nb * QK_K, 3.0);
    let mut b = vec![BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; 16] }; nb];
    quant::q8_k::quantize_row_ref(&x, &mut b);
    b
}

/// Σ|w·a| of the dequantized values: the natural scale for rounding-order differences.
fn abs_dot(w: &[f32], a: &[f32]) -> f64 {
    w.iter().zip(a).map(|(x, y)| (x * y).abs() as f64).sum()
}

fn check(name: &str, isa: Isa, nb: usize, got: f32, want: f32, scale: f64) {
    let tol = 1e-5 * (1.0 + scale);
    assert!(
        ((got - want) as f64).abs() <= tol,
        "{name} {isa} nb={nb}: got {got}, ref {want}, diff {} > tol {tol}",
        (got - want).abs()
    );
}

macro_rules! test32 {
    ($test:ident, $block:ty, $module:ident, $refdot:ident, $vdot:ident, $panel:ident) => {
        #[test]
        fn $test() {
            let mut rng = ChaCha8Rng::seed_from_u64(0x5eed ^ stringify!($test).len() as u64);
            for nb in 1..=9 {
                for _trial in 0..4 {
                    let x = randv(&mut rng, nb * 32, 2.0);
                    let mut w = vec![<$block>::default(); nb];
                    quant::$module::quantize_row_ref(&x, &mut w);
                    let a = q8_0_row(&mut rng, nb);
                    let want = quant::$module::$refdot(&w, &a);
                    let (mut wf, mut af) = (vec![0f32; nb * 32], vec![0f32; nb * 32]);
                    quant::$module::dequantize_row_ref(&w, &mut wf);
                    quant::q8_0::dequantize_row_ref(&a, &mut af);
                    let mut act = A32::default();
                    act.push(&a);
                    for k in levels() {
                        let got = k.$vdot(&w, act.view());
                        check(stringify!($test), k.isa, nb, got, want, abs_dot(&wf, &af));
                    }
                }
            }
            // Panels: rows not divisible by the tile, activation counts around the tile width.
            for nb in [1, 3, 9] {
                let rows = 11;
                let mut w = vec![<$block>::default(); nb * rows];
                quant::$module::quantize_row_ref(&randv(&mut rng, nb * 32 * rows, 2.0), &mut w);
                let mut wf = vec![0f32; nb * 32 * rows];
                quant::$module::dequantize_row_ref(&w, &mut wf);
                for n_out in [1, 2, 3, 4, 5, 7, 8, 17] {
                    // group 1: ggml Q8_0 activations; group 2: high + residual pairs from f32 rows.
                    let mut act1 = A32::default();
                    let rows_a: Vec<Vec<BlockQ8_0>> = (0..n_out).map(|_| q8_0_row(&mut rng, nb)).collect();
                    for r in &rows_a {
                        act1.push(r);
                    }
                    let xs = randv(&mut rng, n_out * nb * 32, 3.0);
                    let act2 = A32::pairs(&xs, nb * 32);
                    for k in levels() {
                        for group in [1, 2] {
                            let act = if group == 1 { &act1 } else { &act2 };
                            let mut out = vec![f32::NAN; n_out * rows];
                            (k.$panel)(
                                &w,
                                nb,
                                0..rows,
                                act.view(),
                                n_out * group,
                                group,
                                &OutSink::new(&mut out, rows),
                            );
                            for o in 0..n_out {
                                let one = act.rows(o * group, group, nb);
                                for r in 0..rows {
                                    let mut single = vec![f32::NAN; rows];
                                    (k.$panel)(
                                        &w,
                                        nb,
                                        r..r + 1,
                                        one.view(),
                                        group,
                                        group,
                                        &OutSink::new(&mut single, rows),
                                    );
                                    assert_eq!(
                                        out[o * rows + r].to_bits(),
                                        single[r].to_bits(),
                                        "{} {} panel nb={nb} n_out={n_out} group={group} o={o} r={r}",
                                        stringify!($test),
                                        k.isa
                                    );
                                    if group == 2 {
                                        let wr = &wf[r * nb * 32..(r + 1) * nb * 32];
                                        let xr = &xs[o * nb * 32..(o + 1) * nb * 32];
                                        let want: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                                        let got = out[o * rows + r] as f64;
                                        let tol = 1e-4 * (1.0 + abs_dot(wr, xr));
                                        assert!(
                                            (got - want).abs() <= tol,
                                            "{} {} pair: {got} vs {want}",
                                            stringify!($test),
                                            k.isa
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

test32!(q8_0_matches_ref, quant::BlockQ8_0, q8_0, vec_dot_q8_0_q8_0_ref, vec_dot_q8_0, q8_0);
test32!(q4_0_matches_ref, quant::BlockQ4_0, q4_0, vec_dot_q4_0_q8_0_ref, vec_dot_q4_0, q4_0);
test32!(q4_1_matches_ref, quant::BlockQ4_1, q4_1, vec_dot_q4_1_q8_0_ref, vec_dot_q4_1, q4_1);
test32!(q5_0_matches_ref, quant::BlockQ5_0, q5_0, vec_dot_q5_0_q8_0_ref, vec_dot_q5_0, q5_0);

macro_rules! testk {
    ($test:ident, $block:ty, $module:ident, $refdot:ident, $vdot:ident, $panel:ident) => {
        #[test]
        fn $test() {
            let mut rng = ChaCha8Rng::seed_from_u64(0x6eed ^ stringify!($test).len() as u64);
            let zero = <$block as KZero>::zero();
            for nb in 1..=4 {
                for _trial in 0..3 {
                    let x = randv(&mut rng, nb * QK_K, 2.0);
                    let mut w = vec![zero; nb];
                    quant::$module::quantize_row_ref(&x, &mut w);
                    let a = q8_k_row(&mut rng, nb);
                    let want = quant::$module::$refdot(&w, &a);
                    let (mut wf, mut af) = (vec![0f32; nb * QK_K], vec![0f32; nb * QK_K]);
                    quant::$module::dequantize_row_ref(&w, &mut wf);
                    quant::q8_k::dequantize_row_ref(&a, &mut af);
                    for k in levels() {
                        let got = k.$vdot(&w, &a);
                        check(stringify!($test), k.isa, nb, got, want, abs_dot(&wf, &af));
                    }
                }
            }
            for nb in [1, 2] {
                let rows = 7;
                let mut w = vec![zero; nb * rows];
                quant::$module::quantize_row_ref(&randv(&mut rng, nb * QK_K * rows, 2.0), &mut w);
                for n_act in [1, 2, 3, 4, 5, 6, 9] {
                    let act: Vec<BlockQ8K> = (0..n_act).flat_map(|_| q8_k_row(&mut rng, nb)).collect();
                    for k in levels() {
                        for group in [1, 2] {
                            if n_act % group != 0 {
                                continue;
                            }
                            let mut out = vec![f32::NAN; n_act / group * rows];
                            (k.$panel)(&w, nb, 0..rows, &act, n_act, group, &OutSink::new(&mut out, rows));
                            for i in 0..n_act / group {
                                for r in 0..rows {
                                    let wr = &w[r * nb..(r + 1) * nb];
                                    let mut want = 0.0f32;
                                    for g in 0..group {
                                        let a = i * group + g;
                                        let v = k.$vdot(wr, &act[a * nb..(a + 1) * nb]);
                                        want = if g == 0 { v } else { want + v };
                                    }
                                    assert_eq!(
                                        out[i * rows + r].to_bits(),
                                        want.to_bits(),
                                        "{} {} panel nb={nb} n_act={n_act} group={group} i={i} r={r}",
                                        stringify!($test),
                                        k.isa
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

/// An all-zero block to overwrite (the K-quant structs have no Default).
trait KZero {
    fn zero() -> Self;
}
impl KZero for quant::BlockQ2K {
    fn zero() -> Self {
        quant::BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO }
    }
}
impl KZero for quant::BlockQ4K {
    fn zero() -> Self {
        quant::BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] }
    }
}
impl KZero for quant::BlockQ6K {
    fn zero() -> Self {
        quant::BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO }
    }
}

testk!(q4_k_matches_ref, quant::BlockQ4K, q4_k, vec_dot_q4_k_q8_k_ref, vec_dot_q4_k, q4_k);
testk!(q6_k_matches_ref, quant::BlockQ6K, q6_k, vec_dot_q6_k_q8_k_ref, vec_dot_q6_k, q6_k);
testk!(q2_k_matches_ref, quant::BlockQ2K, q2_k, vec_dot_q2_k_q8_k_ref, vec_dot_q2_k, q2_k);

/// Random K-quant bytes (not produced by the quantizer) reach every bit of the scales, including Q6_K's negative
/// scales and Q4_K's high scale bits.
#[test]
fn k_quants_random_bytes_match_ref() {
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let h = |rng: &mut ChaCha8Rng| f16::from_f32(rng.random_range(-0.02f32..0.02));
    for nb in 1..=3 {
        let a = q8_k_row(&mut rng, nb);
        let w4: Vec<quant::BlockQ4K> = (0..nb)
            .map(|_| quant::BlockQ4K {
                d: h(&mut rng),
                dmin: h(&mut rng),
                scales: rng.random(),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let w6: Vec<quant::BlockQ6K> = (0..nb)
            .map(|_| quant::BlockQ6K {
                ql: std::array::from_fn(|_| rng.random()),
                qh: std::array::from_fn(|_| rng.random()),
                scales: rng.random(),
                d: h(&mut rng),
            })
            .collect();
        let w2: Vec<quant::BlockQ2K> = (0..nb)
            .map(|_| quant::BlockQ2K {
                scales: rng.random(),
                qs: std::array::from_fn(|_| rng.random()),
                d: h(&mut rng),
                dmin: h(&mut rng),
            })
            .collect();
        for k in levels() {
            let scale = 50.0;
            check(
                "q4_k random",
                k.isa,
                nb,
                k.vec_dot_q4_k(&w4, &a),
                quant::q4_k::vec_dot_q4_k_q8_k_ref(&w4, &a),
                scale,
            );
            check(
                "q6_k random",
                k.isa,
                nb,
                k.vec_dot_q6_k(&w6, &a),
                quant::q6_k::vec_dot_q6_k_q8_k_ref(&w6, &a),
                scale,
            );
            check(
                "q2_k random",
                k.isa,
                nb,
                k.vec_dot_q2_k(&w2, &a),
                quant::q2_k::vec_dot_q2_k_q8_k_ref(&w2, &a),
                scale,
            );
        }
    }
}

/// Random Q8_0/Q5_0 bytes: every weight value including −128 (Q8_0) and all 32 fifth bits (Q5_0).
#[test]
fn q8_0_q5_0_random_bytes_match_ref() {
    let mut rng = ChaCha8Rng::seed_from_u64(78);
    for nb in 1..=9 {
        let a = q8_0_row(&mut rng, nb);
        let mut act = A32::default();
        act.push(&a);
        let w8: Vec<BlockQ8_0> = (0..nb)
            .map(|_| BlockQ8_0 {
                d: f16::from_f32(rng.random_range(-0.05..0.05)),
                qs: std::array::from_fn(|_| rng.random()),
            })
            .collect();
        let w5: Vec<quant::BlockQ5_0> = (0..nb)
            .map(|_| quant::BlockQ5_0 {
                d: f16::from_f32(rng.random_range(-0.05..0.05)),
                qh: rng.random(),
                qs: rng.random(),
            })
            .collect();
        for k in levels() {
            check(
                "q8_0 random",
                k.isa,
                nb,
                k.vec_dot_q8_0(&w8, act.view()),
                quant::q8_0::vec_dot_q8_0_q8_0_ref(&w8, &a),
                200.0,
            );
            check(
                "q5_0 random",
                k.isa,
                nb,
                k.vec_dot_q5_0(&w5, act.view()),
                quant::q5_0::vec_dot_q5_0_q8_0_ref(&w5, &a),
                200.0,
            );
        }
    }
}

const LENGTHS: [usize; 22] = [0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 255, 257, 1023];

#[test]
fn f32_helpers_match_scalar_at_any_length() {
    let mut rng = ChaCha8Rng::seed_from_u64(79);
    for n in LENGTHS {
        let a = randv(&mut rng, n, 1.0);
        let b = randv(&mut rng, n, 1.0);
        let bh: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let want_h: f64 = a.iter().zip(&bh).map(|(x, y)| *x as f64 * y.to_f64()).sum();
        let scale: f64 = a.iter().zip(&b).map(|(x, y)| (x * y).abs() as f64).sum();
        for k in levels() {
            let tol = 1e-6 * (1.0 + scale);
            let got = (k.dot_f32)(&a, &b) as f64;
            assert!((got - want).abs() <= tol, "dot {} n={n}: {got} vs {want}", k.isa);
            let got = (k.dot_f16)(&a, &bh) as f64;
            assert!((got - want_h).abs() <= tol, "dot_f16 {} n={n}: {got} vs {want_h}", k.isa);

            let mut y = b.clone();
            (k.axpy_f32)(0.75, &a, &mut y);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.75 * a[i])).abs() <= 1e-6, "axpy {} n={n} i={i}", k.isa);
            }
            let mut y = a.clone();
            (k.axpy_f16)(-1.5, &bh, &mut y);
            for i in 0..n {
                assert!((y[i] - (a[i] - 1.5 * bh[i].to_f32())).abs() <= 1e-6, "axpy_f16 {} n={n} i={i}", k.isa);
            }
            let mut y = a.clone();
            (k.scale_f32)(0.3, &mut y);
            for i in 0..n {
                assert_eq!(y[i], a[i] * 0.3, "scale {} n={n} i={i}", k.isa);
            }
        }
    }
}

#[test]
fn f32_f16_panels_match_dot() {
    let mut rng = ChaCha8Rng::seed_from_u64(80);
    for cols in [1, 7, 8, 17, 64, 100] {
        let rows = 9;
        let w = randv(&mut rng, rows * cols, 1.0);
        let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
        for n_act in [1, 2, 3, 4, 7] {
            let x = randv(&mut rng, n_act * cols, 1.0);
            for k in levels() {
                let mut o32 = vec![f32::NAN; n_act * rows];
                let mut o16 = vec![f32::NAN; n_act * rows];
                (k.f32)(&w, cols, 0..rows, &x, n_act, &OutSink::new(&mut o32, rows));
                (k.f16)(&wh, cols, 0..rows, &x, n_act, &OutSink::new(&mut o16, rows));
                for i in 0..n_act {
                    for r in 0..rows {
                        let xr = &x[i * cols..(i + 1) * cols];
                        let want: f64 =
                            w[r * cols..(r + 1) * cols].iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let want_h: f64 =
                            wh[r * cols..(r + 1) * cols].iter().zip(xr).map(|(a, b)| a.to_f64() * *b as f64).sum();
                        let tol = 1e-5 * (1.0 + cols as f64);
                        assert!((o32[i * rows + r] as f64 - want).abs() <= tol, "f32 panel {} cols={cols}", k.isa);
                        assert!((o16[i * rows + r] as f64 - want_h).abs() <= tol, "f16 panel {} cols={cols}", k.isa);
                    }
                }
            }
        }
    }
}

#[test]
fn isa_names_and_env() {
    for i in Isa::ALL {
        assert_eq!(Isa::from_name(i.name()), Some(i));
        assert_eq!(i.to_string(), i.name());
    }
    assert_eq!(Isa::from_name("sse9"), None);
    assert!(Isa::available().contains(&Isa::Scalar));
    assert!(Isa::available().contains(&Isa::best()));
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        // The AMX level is the AVX-512 level plus tiles, where the CPU and OS allow them.
        let want = if Isa::Amx.is_supported() { Isa::Amx } else { Isa::Avx512 };
        assert_eq!(Isa::best(), want, "a plain build must get the widest path on this CPU");
    }
    // Whatever INFER_ISA says for this run, the chosen level is one this CPU has (or an error naming the value).
    match infer_kernels::dispatch::try_isa() {
        Ok(isa) => assert!(isa.is_supported()),
        Err(e) => assert!(e.to_string().contains("INFER_ISA")),
    }
}

#[test]
fn activation_quantizers_give_the_same_bytes_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(81);
    let scalar = Isa::Scalar.kernels().unwrap();
    // One block, a part run, runs of 8 blocks with a part run after (576), and whole runs only (1536).
    for cols in [32, 96, 576, 1536] {
        let mut x = randv(&mut rng, cols, 5.0);
        x[..32].fill(0.0); // an all-zero block: d = 0
        if cols > 32 {
            x[40] = 1e-30; // a tiny value next to larger ones
        }
        for k in levels() {
            for g in [1, 2] {
                let nb = cols / 32;
                let run = |k: &Kernels| {
                    let (mut q, mut d, mut s, mut i) =
                        (vec![0i8; g * cols], vec![0f32; g * nb], vec![0f32; g * nb], vec![0; g * nb]);
                    (k.quantize32)(&x, g, &mut q, &mut d, &mut s, &mut i);
                    (
                        q,
                        d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        i,
                    )
                };
                assert_eq!(run(k), run(scalar), "quantize32 {} cols={cols} group={g}", k.isa);
            }
        }
    }
    for k in levels() {
        let x = randv(&mut rng, 512, 3.0);
        let z = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; 16] };
        let (mut a, mut b) = (vec![z; 4], vec![z; 4]);
        (k.quantize_k)(&x, 2, &mut a);
        (scalar.quantize_k)(&x, 2, &mut b);
        assert_eq!(a, b, "quantize_k {}", k.isa);
    }
}

#[test]
fn activations_match_the_libm_definitions_on_every_level() {
    // Values across the whole useful range, the saturated tails, zeros and the odd lengths of the SIMD tails.
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut gate: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.05).collect();
    gate.extend(randv(&mut rng, 333, 12.0));
    gate.extend([0.0, -0.0, 1e-30, -1e-30, 80.0, -80.0, 200.0, -200.0, 1e30, -1e30]);
    let up: Vec<f32> = (0..gate.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
    let silu = |x: f64| x / (1.0 + (-x).exp());
    // 0.5·x·(1 + tanh z) written as x·σ(2z), which f64 evaluates without cancelling to 0 in the far tail.
    let gelu = |x: f64| x / (1.0 + (-2.0 * 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).exp());
    for k in levels() {
        for len in [gate.len(), 1, 15, 17] {
            for (name, f, want) in
                [("swiglu", k.swiglu, &silu as &dyn Fn(f64) -> f64), ("geglu", k.geglu, &gelu as &dyn Fn(f64) -> f64)]
            {
                let mut g = gate[..len].to_vec();
                f(&mut g, &up[..len]);
                for i in 0..len {
                    let w = want(gate[i] as f64) * up[i] as f64;
                    // Relative to the value, widened by the f32 rounding of exp's argument (one ulp of it moves
                    // e^arg by |arg|·6e-8 relative), plus an absolute floor for the far tail.
                    let x = gate[i] as f64;
                    let arg = if name == "swiglu" { x.abs() } else { (1.6 * (x + 0.044715 * x * x * x)).abs() };
                    let tol = (4e-7 + 1.2e-7 * arg) * w.abs() + 1e-30;
                    assert!(
                        (g[i] as f64 - w).abs() <= tol || (!w.is_finite() && g[i].is_finite() == w.is_finite()),
                        "{} {name}({}) · {} = {} , want {w}",
                        k.isa,
                        gate[i],
                        up[i],
                        g[i]
                    );
                }
            }
        }
        let mut nan = vec![f32::NAN; 3];
        (k.swiglu)(&mut nan, &[1.0; 3]);
        assert!(nan.iter().all(|v| v.is_nan()), "{}: NaN must stay NaN", k.isa);
    }
}

#[test]
fn attention_kernels_equal_their_scalar_statements() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let scalar = Isa::Scalar.kernels().unwrap();
    for k in levels() {
        // Scores against a transposed key block: every head count the tiles split (1..=3 per tile, and runs of 4
        // for f16 keys), 8- and 16-lane tails, odd head dimensions (an unpaired last dimension).
        for hd in [1, 7, 8, 31, 64, 100] {
            for lanes in [8, 16, 24, 32] {
                for heads in [1, 2, 3, 4, 5, 7, 8] {
                    let kt = randv(&mut rng, hd * lanes, 2.0);
                    let kt16: Vec<f16> = kt.iter().map(|&v| f16::from_f32(v)).collect();
                    let q = randv(&mut rng, heads * hd, 1.0);
                    let (mut got, mut want) = (vec![f32::NAN; heads * lanes], vec![0f32; heads * lanes]);
                    (k.dot_cols_f32)(&q, &kt, lanes, &mut got);
                    vec_f32::dot_cols_ref(&q, &kt, lanes, &mut want, |v| v);
                    assert_eq!(bits(&got), bits(&want), "{} dot_cols_f32 hd={hd} lanes={lanes} heads={heads}", k.isa);
                    (k.dot_cols_f16)(&q, &kt16, lanes, &mut got);
                    vec_f32::dot_cols_ref(&q, &kt16, lanes, &mut want, f16::to_f32);
                    assert_eq!(bits(&got), bits(&want), "{} dot_cols_f16 hd={hd} lanes={lanes} heads={heads}", k.isa);
                }
            }
        }
        // Value sums for heads sharing rows: widths with 64-, 32-, 16-, 8-wide tiles and scalar tails, row runs of
        // 0..=16, the weights `w_stride` apart per head as the attention's score rows are.
        for width in [1, 7, 8, 16, 31, 32, 48, 64, 100, 144, 256] {
            for n in [0, 1, 5, 16] {
                for heads in [1, 2, 3, 4, 5, 9] {
                    let v_stride = width + 13;
                    let w_stride = 16 + 3;
                    let rows = randv(&mut rng, n.max(1) * v_stride, 2.0);
                    let rows16: Vec<f16> = rows.iter().map(|&v| f16::from_f32(v)).collect();
                    let w = randv(&mut rng, heads * w_stride, 1.0);
                    let a = AxpyRows { n, w: &w, w_stride, v_stride, width };
                    let start = randv(&mut rng, heads * width, 1.0);
                    let (mut got, mut want) = (start.clone(), start.clone());
                    (k.axpy_rows_f32)(a, &rows, &mut got);
                    vec_f32::axpy_rows_ref(a, &rows, &mut want, |v| v);
                    assert_eq!(bits(&got), bits(&want), "{} axpy_rows_f32 width={width} n={n} heads={heads}", k.isa);
                    let (mut got, mut want) = (start.clone(), start);
                    (k.axpy_rows_f16)(a, &rows16, &mut got);
                    vec_f32::axpy_rows_ref(a, &rows16, &mut want, f16::to_f32);
                    assert_eq!(bits(&got), bits(&want), "{} axpy_rows_f16 width={width} n={n} heads={heads}", k.isa);
                }
            }
        }
        // f16 → f32 conversion: exact, so equal to the scalar statement at every length (8-wide body, tails),
        // including infinities, NaN, subnormals and signed zeros.
        for n in [0, 1, 7, 8, 9, 16, 63, 64, 1024] {
            let mut src: Vec<f16> = randv(&mut rng, n, 100.0).iter().map(|&v| f16::from_f32(v)).collect();
            let special = [f16::INFINITY, f16::NEG_INFINITY, f16::NAN, f16::from_bits(1), f16::NEG_ZERO, f16::MAX];
            for (x, s) in src.iter_mut().zip(special) {
                *x = s;
            }
            let (mut got, mut want) = (vec![f32::NAN; n], vec![0f32; n]);
            (k.f16_to_f32)(&src, &mut got);
            vec_f32::f16_to_f32_ref(&src, &mut want);
            assert_eq!(bits(&got), bits(&want), "{} f16_to_f32 n={n}", k.isa);
        }
        // 8-bit KV blocks → f32: one exact product per value, so equal to the scalar statement, for rows of blocks
        // (lanes 1, cached values) and transposed tiles (cached keys, 16 lanes), with a zero and a huge scale.
        for (lanes, rows) in [(1, 32), (1, 256), (16, 32), (16, 64), (3, 96)] {
            let n = lanes * rows;
            let q: Vec<i8> = (0..n).map(|_| rng.random_range(-127i32..=127) as i8).collect();
            let mut d = randv(&mut rng, n / 32, 0.05);
            d[0] = 0.0;
            if let Some(x) = d.get_mut(1) {
                *x = 3e38;
            }
            let (mut got, mut want) = (vec![f32::NAN; n], vec![0f32; n]);
            (k.dequant_q8)(&q, &d, lanes, &mut got);
            vec_f32::dequant_q8_ref(&q, &d, lanes, &mut want);
            assert_eq!(bits(&got), bits(&want), "{} dequant_q8 lanes={lanes} rows={rows}", k.isa);
        }
        // Softmax blocks: weights e^(x·scale − max) to about an ulp, tails to exactly 0, the running state's
        // rescaling, and bit-equal results on every level.
        let scale = 0.125;
        let mut state = SoftmaxState::EMPTY;
        let mut scalar_state = SoftmaxState::EMPTY;
        let mut sums = 0f64;
        for (len, spread) in [(13, 20.0), (16, 400.0), (3, 1.0), (40, 100.0)] {
            let mut x = randv(&mut rng, len, spread);
            if len == 40 {
                x.extend([f32::NEG_INFINITY, -1e30, 0.0]);
            }
            let orig = x.clone();
            let old = state;
            let r = (k.softmax_block)(&mut x, scale, &mut state);
            let max = orig.iter().fold(old.max, |a, &b| a.max(b * scale));
            assert_eq!(state.max, max, "{}: running maximum", k.isa);
            if max > old.max {
                let want = ((old.max - max) as f64).exp();
                assert!((r as f64 - want).abs() <= 3e-7 * want + 1e-37, "{}: rescale {r}, want {want}", k.isa);
            } else {
                assert_eq!(r, 1.0, "{}: no rescale when the maximum holds", k.isa);
            }
            for (g, o) in x.iter().zip(&orig) {
                let want = ((*o * scale - max) as f64).exp(); // of the f32 difference, as the kernel sees it
                assert!((*g as f64 - want).abs() <= 3e-7 * want + 1e-37, "{} exp({o}·s − {max}) = {g}", k.isa);
            }
            sums = sums * r as f64 + x.iter().map(|&v| v as f64).sum::<f64>();
            assert!((state.sum as f64 - sums).abs() <= 1e-5 * sums, "{}: running sum {} vs {sums}", k.isa, state.sum);
            let mut y = orig.clone();
            (scalar.softmax_block)(&mut y, scale, &mut scalar_state);
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(state.sum.to_bits(), scalar_state.sum.to_bits(), "{}: sums equal the scalar level's", k.isa);
        }
    }
}
