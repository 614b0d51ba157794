//! 16-row panels: packing keeps every weight, each level's panel kernel equals `packed::panel_ref` bit for bit (the
//! AMX float tiles within a stated bound),
//! and a packed matrix multiplies like its GGUF layout (same rows at any batch size, on any thread count).

use half::f16;
use infer_kernels::GgmlType;
use infer_kernels::dispatch::{Act32, Isa, OutSink, PanelPacked, quantize_row32};
use infer_kernels::matmul::{ActPrecision, MatmulScratch, WeightMatrix, matmul, matmul_multi};
use infer_kernels::packed::{self, PANEL_ROWS, PackedMatrix};
use infer_kernels::quant::{self, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, blocks_as_bytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TYPES: [GgmlType; 6] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];
/// The unquantized formats, whose panels take f32 activations.
const FLOATS: [GgmlType; 2] = [GgmlType::F32, GgmlType::F16];

/// Columns in blocks of 32 for a type: its own block size must divide them (256 for the K-quants).
fn cols_for(ty: GgmlType, blocks32: usize) -> usize {
    (32 * blocks32).next_multiple_of(ty.block_size())
}

fn randv(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect()
}

/// Random weights quantized to `ty`: (GGUF bytes, dequantized values).
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    quantized(ty, &randv(&mut rng, rows * cols, 1.0))
}

/// `x` quantized to `ty`: (GGUF bytes, dequantized values).
fn quantized(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let x = x.to_vec();
    let n = x.len() / ty.block_size();
    let bytes = match ty {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
        GgmlType::Q4_0 => {
            let mut b = vec![BlockQ4_0::default(); n];
            quant::q4_0::quantize_row_ref(&x, &mut b);
            blocks_as_bytes(&b).to_vec()
        }
        GgmlType::Q4_1 => {
            let mut b = vec![BlockQ4_1::default(); n];
            quant::q4_1::quantize_row_ref(&x, &mut b);
            blocks_as_bytes(&b).to_vec()
        }
        GgmlType::Q5_0 => {
            let mut b = vec![BlockQ5_0::default(); n];
            quant::q5_0::quantize_row_ref(&x, &mut b);
            blocks_as_bytes(&b).to_vec()
        }
        GgmlType::Q8_0 => {
            let mut b = vec![BlockQ8_0::default(); n];
            quant::q8_0::quantize_row_ref(&x, &mut b);
            blocks_as_bytes(&b).to_vec()
        }
        GgmlType::Q4_K => {
            let mut b = vec![zeroed_q4_k(); n];
            quant::q4_k::quantize_row_ref(&x, &mut b);
            blocks_as_bytes(&b).to_vec()
        }
        GgmlType::Q6_K => {
            let mut b = vec![zeroed_q6_k(); n];
            quant::q6_k::quantize_row_ref(&x, &mut b);
            // Negative sub-block scales occur in real files (the quantizer picks the sign of the largest weight);
            // flip some so that the kernels see them.
            for blk in b.iter_mut().step_by(3) {
                blk.scales[5] = blk.scales[5].wrapping_neg();
            }
            blocks_as_bytes(&b).to_vec()
        }
        _ => unreachable!(),
    };
    let mut deq = vec![0f32; x.len()];
    infer_kernels::dequantize(ty, &bytes, &mut deq).unwrap();
    (bytes, deq)
}

fn zeroed_q4_k() -> BlockQ4K {
    BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] }
}

fn zeroed_q6_k() -> BlockQ6K {
    BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO }
}

/// `Vec<u8>` has no alignment guarantee; the block types need 2 (f16 scales), so copy into f16s.
fn aligned(bytes: &[u8]) -> Vec<f16> {
    bytes.chunks(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]))).collect()
}

fn as_bytes(v: &[f16], len: usize) -> &[u8] {
    &blocks_as_bytes(v)[..len]
}

fn pack(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<f16>, usize, Vec<f32>, PackedMatrix) {
    let (bytes, deq) = weights(ty, rows, cols, seed);
    let al = aligned(&bytes);
    let p = packed::pack(ty, as_bytes(&al, bytes.len()), rows, cols).expect("packable");
    (al, bytes.len(), deq, p)
}

/// Activation rows in the kernels' layout (`group` 2: high + residual pairs).
struct Act {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    isum: Vec<i32>,
}

impl Act {
    fn new(x: &[f32], cols: usize, group: usize) -> Act {
        let (nb, m) = (cols / 32, x.len() / cols);
        let mut a = Act {
            qs: vec![0; m * group * cols],
            d: vec![0.0; m * group * nb],
            s: vec![0.0; m * group * nb],
            isum: vec![0; m * group * nb],
        };
        for (i, row) in x.chunks(cols).enumerate() {
            let (q, b) = (i * group * cols, i * group * nb);
            quantize_row32(
                row,
                group,
                &mut a.qs[q..q + group * cols],
                &mut a.d[b..b + group * nb],
                &mut a.s[b..b + group * nb],
                &mut a.isum[b..b + group * nb],
            );
        }
        a
    }
    fn view(&self) -> Act32<'_> {
        Act32 { qs: &self.qs, d: &self.d, s: &self.s, isum: &self.isum }
    }
}

/// What `f` writes for `n_out` output rows of `rows` values, into a sink that starts as NaN (so an output left
/// unwritten shows).
fn outputs(n_out: usize, rows: usize, f: impl Fn(&OutSink<'_>)) -> Vec<f32> {
    let mut out = vec![f32::NAN; n_out * rows];
    f(&OutSink::new(&mut out, rows));
    out
}

/// Asserts that `got` equals `want` bit for bit (a NaN matching any NaN); `what` names the case in the message.
fn assert_same_bits(got: &[f32], want: &[f32], what: std::fmt::Arguments<'_>) {
    assert_eq!(got.len(), want.len(), "{what}: output lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what} [{i}]: {g} vs {w}");
    }
}

/// A level's quantized panel kernel and `panel_ref` over the same panels and activations: (kernel, reference).
fn kernel_and_ref(
    kernel: PanelPacked,
    p: &PackedMatrix,
    act: &Act,
    n_out: usize,
    group: usize,
    panels: std::ops::Range<usize>,
) -> (Vec<f32>, Vec<f32>) {
    let (rows, n_act) = (p.rows(), n_out * group);
    let got = outputs(n_out, rows, |o| kernel(p.view(), panels.clone(), act.view(), n_act, group, o));
    let want = outputs(n_out, rows, |o| packed::panel_ref(p.view(), panels.clone(), act.view(), n_act, group, o));
    (got, want)
}

#[test]
fn packing_keeps_every_weight() {
    for ty in TYPES.into_iter().chain(FLOATS) {
        let (rows, cols) = (48, cols_for(ty, 3));
        let (_, _, deq, p) = pack(ty, rows, cols, 3);
        let v = p.view();
        assert_eq!((v.n_panels, v.nb), (3, cols / 32));
        for row in 0..rows {
            for k in 0..cols {
                let (pi, r, b, kk) = (row / PANEL_ROWS, row % PANEL_ROWS, k / 32, k % 32);
                let got = v.weight(pi, b, r, kk);
                let want = deq[row * cols + k];
                assert!((got - want).abs() <= 1e-6 * (1.0 + want.abs()), "{ty} ({row},{k}): {got} vs {want}");
            }
        }
    }
}

#[test]
fn pack_refuses_what_it_cannot_hold() {
    let (bytes, _) = weights(GgmlType::Q4_1, 32, 64, 1);
    let al = aligned(&bytes);
    let b = as_bytes(&al, bytes.len());
    assert!(packed::pack(GgmlType::Q4_1, b, 32, 64).is_some());
    assert!(packed::pack(GgmlType::Q4_1, &b[..b.len() - 20], 31, 64).is_none(), "rows not a multiple of 16");
    assert!(packed::pack(GgmlType::Q4_1, &b[..b.len() - 20], 32, 64).is_none(), "short data");
    assert!(packed::pack(GgmlType::Q2_K, &[0u8; 16 * 84], 16, 256).is_none(), "no panel form for Q2_K");
    // Zeros as f16s: the Q6_K blocks need their f16's alignment (a `[u8; N]` on the stack may start at an odd address).
    let q6k = vec![f16::ZERO; 16 * 210 / 2];
    assert!(packed::pack(GgmlType::Q6_K, blocks_as_bytes(&q6k), 16, 256).is_some());
    assert!(
        packed::pack(GgmlType::Q6_K, blocks_as_bytes(&q6k), 16, 288).is_none(),
        "K-quant rows are whole super-blocks"
    );
    // A Q4_0 scale whose offset −8·d overflows f16 keeps the GGUF layout.
    let mut blocks = vec![BlockQ4_0::default(); 32];
    quant::q4_0::quantize_row_ref(&vec![1.0; 32 * 32], &mut blocks);
    blocks[5].d = f16::from_f32(60000.0);
    assert!(packed::pack(GgmlType::Q4_0, blocks_as_bytes(&blocks), 16, 64).is_none());
}

#[test]
fn every_level_equals_the_reference_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut tested = Vec::new();
    for isa in Isa::available() {
        let Some(kernel) = isa.kernels().unwrap().packed else { continue };
        tested.push(isa.name());
        for ty in TYPES {
            // K-quant rows are whole super-blocks of 8 blocks; 72 blocks is past the AVX-512 kernel's scale cache
            // (64), so both of its paths are checked; 17 and 72 are past the AVX2 batch tile's widened chunk (16).
            let widths: &[usize] = if ty.block_size() == 256 { &[8, 16, 72] } else { &[1, 2, 5, 9, 17] };
            for &nb in widths {
                let (rows, cols) = (48, 32 * nb);
                let (_, _, _, p) = pack(ty, rows, cols, nb as u64);
                for group in [1, 2] {
                    for n_out in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 70] {
                        let mut x = randv(&mut rng, n_out * cols, 3.0);
                        x[..32].fill(0.0); // an all-zero block: d = 0
                        x[cols - 1] = 1e4; // an outlier
                        let act = Act::new(&x, cols, group);
                        for panels in [0..3, 1..2, 2..3] {
                            let (got, want) = kernel_and_ref(kernel, &p, &act, n_out, group, panels.clone());
                            let what = format_args!("{isa} {ty} nb={nb} group={group} n_out={n_out} panels={panels:?}");
                            assert_same_bits(&got, &want, what);
                        }
                    }
                }
            }
        }
    }
    eprintln!("panel kernels checked against panel_ref: {}", tested.join(", "));
}

/// Many panels against many rows: 37 panels (pairs, then a lone panel) against 150 and 300 activation rows (the
/// `amx` level's chunks of 64 rows and a partial one; the rows past a multiple of 16 on the 512-bit kernel), bit
/// for bit against `panel_ref` at every level.
#[test]
fn every_level_equals_the_reference_over_many_panels_and_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut tested = Vec::new();
    for isa in Isa::available() {
        let Some(kernel) = isa.kernels().unwrap().packed else { continue };
        tested.push(isa.name());
        for ty in TYPES.into_iter().filter(|t| t.block_size() == 32) {
            let (rows, cols) = (16 * 37, 32);
            let (_, _, _, p) = pack(ty, rows, cols, 7);
            for group in [1, 2] {
                let n_out = 150;
                let x = randv(&mut rng, n_out * cols, 3.0);
                let act = Act::new(&x, cols, group);
                for panels in [0..37, 3..36] {
                    let (got, want) = kernel_and_ref(kernel, &p, &act, n_out, group, panels.clone());
                    assert_same_bits(&got, &want, format_args!("{isa} {ty} group={group} panels={panels:?}"));
                }
            }
        }
    }
    eprintln!("panel kernels checked over 37 panels and 150 output rows: {}", tested.join(", "));
}

/// The largest sums a kernel can meet: weights at their format's top quant (15 in the 4-bit formats, 31 in Q5_0,
/// 127 in Q8_0) against activations at full scale, all of one sign, so that every partial sum is as large as it can
/// get. The AVX2 decode tile adds four 16-bit pair sums of `vpmaddubsw` before widening them (at most 31744 for
/// Q5_0); this is where a saturating or overflowing shortcut would show.
#[test]
fn every_level_equals_the_reference_at_the_largest_sums() {
    let (rows, nb) = (32, 9);
    let mut tested = Vec::new();
    for isa in Isa::available() {
        let Some(kernel) = isa.kernels().unwrap().packed else { continue };
        tested.push(isa.name());
        for ty in TYPES {
            let cols = cols_for(ty, nb);
            // Per block of 32: one weight of the largest magnitude and of the other sign, which the symmetric
            // formats map to quant 0 (their scale is negative then), the rest just inside it, which then map to the
            // top quant; the formats with a minimum put the rest at their top quant too.
            let x: Vec<f32> = (0..rows * cols).map(|i| if i % 32 == 0 { 1.0 } else { -0.999 * 7.0 / 8.0 }).collect();
            let (bytes, _) = quantized(ty, &x);
            let al = aligned(&bytes);
            let p = packed::pack(ty, as_bytes(&al, bytes.len()), rows, cols).expect("packable");
            for group in [1, 2] {
                for n_out in [1, 2, 3, 16] {
                    // Constant rows (residual 0) and rows of one sign with random residuals.
                    let mut rng = ChaCha8Rng::seed_from_u64(5);
                    for sign in [1.0f32, -1.0] {
                        let x: Vec<f32> = (0..n_out * cols)
                            .map(|i| {
                                sign * if (i / cols).is_multiple_of(2) { 3.0 } else { rng.random_range(2.9f32..3.0) }
                            })
                            .collect();
                        let act = Act::new(&x, cols, group);
                        let (got, want) = kernel_and_ref(kernel, &p, &act, n_out, group, 0..rows / PANEL_ROWS);
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                g.to_bits() == w.to_bits(),
                                "{isa} {ty} group={group} n_out={n_out} sign={sign} [{i}]: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("panel kernels checked at the largest sums: {}", tested.join(", "));
}

/// Every level's float panel kernel equals `panel_ref_f` bit for bit, except the `amx` level's tiles (16 or more
/// activation rows), which multiply bf16 parts (see `arch/x86_64/amx.rs`): for F16 their error must stay within
/// 2⁻¹⁴ of Σ|w·x| (the parts leave out about 2⁻¹⁶ of each term), for F32 (three parts, six products) within 2⁻²⁰,
/// about what summing the same f32 products in another order gives; the rows past a multiple of 16 are still
/// exact.
#[test]
fn every_level_equals_the_float_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let mut tested = Vec::new();
    // Outputs checked from the tile unit, F32 then F16.
    let mut tiled = [0; 2];
    for isa in Isa::available() {
        let Some(kernel) = isa.kernels().unwrap().packed_f else { continue };
        tested.push(isa.name());
        for ty in FLOATS {
            for nb in [1, 2, 5] {
                let (rows, cols) = (80, 32 * nb);
                let (_, _, _, p) = pack(ty, rows, cols, nb as u64);
                let view = p.view();
                for n_act in [1, 2, 3, 5, 6, 7, 13, 16, 17, 33, 50, 64, 70] {
                    let mut x = randv(&mut rng, n_act * cols, 3.0);
                    x[cols - 1] = 1e4; // an outlier
                    // Rows the tile unit takes (the amx level's whole tiles of 16, past a least number of rows).
                    let on_tiles = isa.float_tile_rows(p.view().format, n_act);
                    let bound = if ty == GgmlType::F16 { 2f32.powi(-14) } else { 2f32.powi(-20) };
                    for panels in [0..5, 1..2, 2..5, 0..4] {
                        let got = outputs(n_act, rows, |o| kernel(p.view(), panels.clone(), &x, n_act, o));
                        let want =
                            outputs(n_act, rows, |o| packed::panel_ref_f(p.view(), panels.clone(), &x, n_act, o));
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            let (a, j) = (i / rows, i % rows);
                            if a < on_tiles && panels.contains(&(j / PANEL_ROWS)) {
                                let (pn, r) = (j / PANEL_ROWS, j % PANEL_ROWS);
                                let abs: f32 = (0..cols)
                                    .map(|k| (view.weight(pn, k / 32, r, k % 32) * x[a * cols + k]).abs())
                                    .sum();
                                assert!(
                                    (g - w).abs() <= abs * bound,
                                    "{isa} {ty} nb={nb} n_act={n_act} panels={panels:?} [{i}]: {g} vs {w} (Σ|w·x| {abs})"
                                );
                                tiled[(ty == GgmlType::F16) as usize] += 1;
                                continue;
                            }
                            assert!(
                                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                                "{isa} {ty} nb={nb} n_act={n_act} panels={panels:?} [{i}]: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
    if Isa::Amx.is_supported() {
        assert!(tiled.iter().all(|&n| n > 0), "the amx level took no F32 or no F16 rows to its tiles: {tiled:?}");
    }
    eprintln!(
        "float panel kernels checked against panel_ref_f: {} (outputs of AMX tiles within the bound: F32 {}, F16 {})",
        tested.join(", "),
        tiled[0],
        tiled[1]
    );
}

#[test]
fn packed_float_matmul_equals_the_gguf_layout() {
    for ty in FLOATS {
        let (rows, cols) = (48, 96);
        let (al, len, deq, p) = pack(ty, rows, cols, 7);
        let gguf = WeightMatrix::new(ty, as_bytes(&al, len), rows, cols).unwrap();
        let pw = WeightMatrix::packed(&p);
        assert!(pw.is_packed() && pw.rows() == rows && pw.cols() == cols && pw.ty() == ty);
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut s = MatmulScratch::new(ActPrecision::Q8x2);
        for m in [1, 4, 11] {
            let x = randv(&mut rng, m * cols, 2.0);
            let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
            matmul(&pw, &x, m, &mut a, &mut s);
            matmul(&gguf, &x, m, &mut b, &mut s);
            for i in 0..m {
                let xr = &x[i * cols..(i + 1) * cols];
                for j in 0..rows {
                    let wr = &deq[j * cols..(j + 1) * cols];
                    let mag: f32 = wr.iter().zip(xr).map(|(w, x)| (w * x).abs()).sum();
                    // Both sum the same f32 products; only the order differs.
                    let (got, gg) = (a[i * rows + j], b[i * rows + j]);
                    assert!((got - gg).abs() <= 1e-5 * (1.0 + mag), "{ty} m={m} ({i},{j}): {got} vs {gg}");
                }
            }
        }
    }
}

#[test]
fn packed_matmul_equals_the_gguf_layout_and_keeps_rows_independent() {
    for ty in TYPES {
        let (rows, cols) = (64, cols_for(ty, 9));
        let (al, len, deq, p) = pack(ty, rows, cols, 5);
        let gguf = WeightMatrix::new(ty, as_bytes(&al, len), rows, cols).unwrap();
        let pw = WeightMatrix::packed(&p);
        assert!(pw.is_packed() && pw.rows() == rows && pw.cols() == cols && pw.ty() == ty);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for m in [1, 3, 17] {
            let x = randv(&mut rng, m * cols, 2.0);
            for prec in [ActPrecision::Q8, ActPrecision::Q8x2] {
                let mut s = MatmulScratch::new(prec);
                let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
                matmul(&pw, &x, m, &mut a, &mut s);
                matmul(&gguf, &x, m, &mut b, &mut s);
                for i in 0..m {
                    let xr = &x[i * cols..(i + 1) * cols];
                    let mut one = vec![f32::NAN; rows];
                    matmul(&pw, xr, 1, &mut one, &mut s);
                    for j in 0..rows {
                        let (got, gg) = (a[i * rows + j], b[i * rows + j]);
                        assert_eq!(got.to_bits(), one[j].to_bits(), "{ty} {prec:?} m={m}: row {i} differs from m=1");
                        let wr = &deq[j * cols..(j + 1) * cols];
                        let mag: f32 = wr.iter().zip(xr).map(|(w, x)| (w * x).abs()).sum();
                        if ty.block_size() == 32 {
                            // Same integers, same scales; only the order of the float epilogue differs.
                            let ok = (got - gg).abs() <= 1e-5 * (1.0 + mag);
                            assert!(ok, "{ty} {prec:?} m={m} ({i},{j}): {got} vs {gg}");
                        } else {
                            // The GGUF-layout K-quant kernels take Q8_K activations (one scale per 256), the
                            // panels the 32-blocks: both within their activations' rounding of the exact sum.
                            let exact: f64 = wr.iter().zip(xr).map(|(&w, &x)| w as f64 * x as f64).sum();
                            let tol = if prec == ActPrecision::Q8 { 1e-2 } else { 1e-4 } * (1.0 + mag as f64);
                            assert!((got as f64 - exact).abs() <= tol, "{ty} {prec:?} ({i},{j}): {got} vs {exact}");
                            assert!((gg as f64 - exact).abs() <= 3e-2 * (1.0 + mag as f64), "{ty} GGUF ({i},{j})");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn packed_matmul_is_the_same_on_one_two_and_three_threads() {
    // A packed matrix, then one in the GGUF layout, whose concatenation is cut mid-panel by the task split:
    // 304 + 160 rows (an even split), and 8000 + 160 (enough for the tail of small tasks that large matrices get,
    // 10% of the rows in two tasks per thread). Inside a team and as a plain rayon loop. The first matrix also meets
    // a prompt that the split cuts into chunks of activation rows, the last one short (not the second: that case is
    // the tail tasks', which a prompt does not use, and under AddressSanitizer it would take minutes).
    let prompt = 2 * infer_kernels::dispatch::kernels().task_rows + 5;
    for (rows1, cols, ms, seed) in [(304, 576, vec![1, 6, prompt], 1), (8000, 64, vec![1, 5], 3)] {
        for ty in TYPES.into_iter().chain(FLOATS) {
            let cols = cols_for(ty, cols / 32);
            let (_, _, _, p1) = pack(ty, rows1, cols, seed);
            let (al2, len2, _, _) = pack(ty, 160, cols, seed + 1);
            let w1 = WeightMatrix::packed(&p1);
            let w2 = WeightMatrix::new(ty, as_bytes(&al2, len2), 160, cols).unwrap();
            for &m in &ms {
                let x = randv(&mut ChaCha8Rng::seed_from_u64(m as u64), m * cols, 1.0);
                let run = |threads: usize, team: bool| {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    pool.install(|| {
                        let mut s = MatmulScratch::new(ActPrecision::Q8x2);
                        let (mut o1, mut o2) = (vec![f32::NAN; m * rows1], vec![f32::NAN; m * 160]);
                        let mut go = || matmul_multi(&[&w1, &w2], &x, m, &mut [&mut o1, &mut o2], &mut s);
                        if team {
                            infer_kernels::parallel::with_team(go)
                        } else {
                            go()
                        }
                        (o1, o2)
                    })
                };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let one = run(1, false);
                assert!(one.0.iter().chain(&one.1).all(|v| v.is_finite()), "{ty} {rows1} rows: every output written");
                for (threads, team) in [(2, false), (2, true), (3, true)] {
                    let got = run(threads, team);
                    let what = format!("{ty} {rows1} rows m={m}, {threads} threads, team {team}");
                    assert_eq!(bits(&one.0), bits(&got.0), "{what}: packed");
                    assert_eq!(bits(&one.1), bits(&got.1), "{what}: GGUF layout after a packed matrix");
                }
            }
        }
    }
}

#[test]
fn pack_then_hands_back_every_source_byte_once() {
    // 100 panels of 16 Q8_0 rows of 2048 columns: 3.5 MB of source, several packing tasks.
    let (ty, rows, cols) = (GgmlType::Q8_0, 1600, 2048);
    let (bytes, _) = weights(ty, rows, cols, 5);
    let al = aligned(&bytes);
    let data = as_bytes(&al, bytes.len());
    let seen = std::sync::Mutex::new(Vec::new());
    let p = packed::pack_then(ty, data, rows, cols, |r| seen.lock().unwrap().push(r)).expect("packable");
    let mut seen = seen.into_inner().unwrap();
    seen.sort_by_key(|r| r.start);
    assert!(seen.len() > 1, "one task only: {seen:?}");
    let mut at = 0;
    for r in &seen {
        assert_eq!(r.start, at, "ranges must tile the source: {seen:?}");
        at = r.end;
    }
    assert_eq!(at, data.len());
    let q = packed::pack(ty, data, rows, cols).unwrap();
    assert_eq!(p.view().bytes, q.view().bytes);
}

#[test]
fn pack_all_equals_packing_each_alone() {
    // Every type, small (a heap buffer alone) and together over 2 MB (a mapped one), with an unpackable type and a
    // Q4_0 matrix whose offset overflows f16 in between: each job's panels equal its own `pack`'s, and its source
    // ranges tile its data.
    let mut sources = Vec::new();
    for (i, ty) in TYPES.into_iter().chain(FLOATS).enumerate() {
        let (rows, cols) = (32 + 16 * i, cols_for(ty, 80));
        let (bytes, deq) = weights(ty, rows, cols, 20 + i as u64);
        sources.push((ty, rows, cols, aligned(&bytes), bytes.len(), deq));
    }
    let mut overflow = vec![BlockQ4_0::default(); 32];
    quant::q4_0::quantize_row_ref(&vec![1.0; 32 * 32], &mut overflow);
    overflow[5].d = f16::from_f32(60000.0);
    let overflow = aligned(blocks_as_bytes(&overflow));
    let q2k = [0u8; 16 * 84];
    let mut jobs: Vec<packed::PackJob<'_>> = sources
        .iter()
        .map(|(ty, rows, cols, al, len, _)| packed::PackJob {
            ty: *ty,
            data: as_bytes(al, *len),
            rows: *rows,
            cols: *cols,
        })
        .collect();
    let bad = [
        packed::PackJob { ty: GgmlType::Q4_0, data: blocks_as_bytes(&overflow), rows: 16, cols: 64 },
        packed::PackJob { ty: GgmlType::Q2_K, data: &q2k, rows: 16, cols: 256 },
    ];
    jobs.splice(3..3, bad);
    let total: usize = jobs.iter().map(|j| j.data.len()).sum();
    assert!(total > 2 << 20, "the shared buffer should be a mapped one: {total} bytes");
    let seen = std::sync::Mutex::new(vec![Vec::new(); jobs.len()]);
    let all = packed::pack_all(&jobs, |j, r| seen.lock().unwrap()[j].push(r));
    assert_eq!(all.len(), jobs.len());
    assert!(all[3].is_none() && all[4].is_none(), "the overflowing Q4_0 and the Q2_K have no panels");
    for (j, (job, got)) in jobs.iter().zip(&all).enumerate() {
        let alone = packed::pack(job.ty, job.data, job.rows, job.cols);
        assert_eq!(got.is_some(), alone.is_some(), "job {j}");
        let (Some(got), Some(alone)) = (got, alone) else { continue };
        assert_eq!(got.view().bytes, alone.view().bytes, "job {j} ({})", job.ty);
        assert_eq!(got.bytes(), alone.bytes());
        let mut ranges = seen.lock().unwrap()[j].clone();
        ranges.sort_by_key(|r| r.start);
        let mut at = 0;
        for r in &ranges {
            assert_eq!(r.start, at, "job {j}: ranges must tile the source: {ranges:?}");
            at = r.end;
        }
        assert_eq!(at, job.data.len(), "job {j}");
    }
    // The shared (mapped) buffer holds the weights themselves, not only the same bytes as a lone packing.
    for (got, (ty, rows, cols, _, _, deq)) in all.iter().filter_map(Option::as_ref).zip(&sources) {
        let v = got.view();
        for row in (0..*rows).step_by(7) {
            for k in (0..*cols).step_by(5) {
                let w = v.weight(row / PANEL_ROWS, k / 32, row % PANEL_ROWS, k % 32);
                let want = deq[row * cols + k];
                assert!((w - want).abs() <= 1e-6 * (1.0 + want.abs()), "{ty} ({row},{k}): {w} vs {want}");
            }
        }
    }
}

#[test]
fn sections_tile_each_panel_in_aligned_pieces_read_in_order() {
    use packed::{PackedFormat, Sections};
    for format in PackedFormat::ALL {
        let step = Sections::group_blocks(format);
        for nb in (step..=9 * step).step_by(step).chain([1, 3, 7].into_iter().filter(|_| step == 2)) {
            let sec = Sections::of(format, nb);
            let end = sec.end();
            assert!(end.is_multiple_of(64), "{format:?} nb={nb}: {end}");
            // Every piece a block reads: (offset, bytes, alignment its load needs).
            let mut pieces = Vec::new();
            for b in 0..nb {
                let first = pieces.len();
                pieces.push((sec.qs(b), format.qs_bytes(), 64));
                let k_first = !format.is_k() || b % 8 == 0;
                if !format.is_float() && k_first {
                    pieces.push((sec.d(b), 32, 32));
                }
                if format.has_min() && k_first {
                    pieces.push((sec.m(b), 32, 32));
                }
                match format {
                    PackedFormat::K4 => pieces.extend([(sec.sc(b), 16, 16), (sec.mn(b), 16, 16)]),
                    PackedFormat::K6 => pieces.push((sec.sc(b), 32, 16)),
                    _ => {}
                }
                // A block's scales lie in its group, after the group's quants: the panel is read front to back.
                let group = sec.qs(b) / sec.group_bytes() * sec.group_bytes();
                for &(off, len, _) in &pieces[first..] {
                    assert!(off >= group && off + len <= group + sec.group_bytes(), "{format:?} nb={nb} block {b}");
                }
            }
            // Aligned, inside the panel, disjoint.
            pieces.sort();
            // Only a partial last group (Q8 with an odd nb) leaves room, that of its missing block's quants.
            let most_gap = if nb.is_multiple_of(step) { 63 } else { format.qs_bytes() };
            let mut at = 0;
            for &(off, len, align) in &pieces {
                assert!(off.is_multiple_of(align), "{format:?} nb={nb}: piece at {off} not {align}-aligned");
                assert!(off >= at, "{format:?} nb={nb}: piece at {off} overlaps the one before (ends at {at})");
                assert!(off - at <= most_gap, "{format:?} nb={nb}: a gap at {at}..{off}");
                at = off + len;
            }
            assert!(at <= end && end - at < 64, "{format:?} nb={nb}: pieces end at {at}, panel at {end}");
        }
    }
}
