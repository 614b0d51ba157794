//! Portable kernels: the fallback on CPUs without AVX2 and the baseline the SIMD levels are compared with.
//!
//! Integer sums are exact; each block's float contribution is added in block order, so results are deterministic.

use std::ops::Range;

use half::f16;

use super::{q4k_scales_mins, unpack_nibbles, unpack_q2_k, unpack_q4_k, unpack_q5_0, unpack_q6_k};
use crate::dispatch::{Act32, Kernels, OutSink};
use crate::quant::{BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8K};

pub(crate) static KERNELS: Kernels = Kernels {
    isa: crate::dispatch::Isa::Scalar,
    dot_f32,
    axpy_f32,
    scale_f32,
    dot_f16,
    axpy_f16,
    f32: panel_f32,
    f16: panel_f16,
    q8_0: panel_q8_0,
    q4_0: panel_q4_0,
    q4_1: panel_q4_1,
    q5_0: panel_q5_0,
    q2_k: panel_q2_k,
    q4_k: panel_q4_k,
    q6_k: panel_q6_k,
    // The panel layout exists for wide registers; the scalar level keeps the GGUF layout (and
    // `packed::panel_ref` states the panel kernels' arithmetic for tests).
    packed: None,
    packed_f: None,
    packed_formats: &[],
    dot_cols_f32: |q, kt, lanes, out| crate::vec_f32::dot_cols_ref(q, kt, lanes, out, |v| v),
    dot_cols_f16: |q, kt, lanes, out| crate::vec_f32::dot_cols_ref(q, kt, lanes, out, f16::to_f32),
    axpy_rows_f32: |a, v, out| crate::vec_f32::axpy_rows_ref(a, v, out, |x| x),
    axpy_rows_f16: |a, v, out| crate::vec_f32::axpy_rows_ref(a, v, out, f16::to_f32),
    f16_to_f32: crate::vec_f32::f16_to_f32_ref,
    dequant_q8: crate::vec_f32::dequant_q8_impl,
    softmax_block: crate::vec_f32::softmax_block_impl,
    swiglu: crate::vec_f32::swiglu_impl,
    geglu: crate::vec_f32::geglu_impl,
    quantize32: crate::dispatch::quantize_row32_impl,
    quantize_k: crate::matmul::quantize_row_k_impl,
    // The scalar kernels have no chunks of their own; this is the widest level's.
    task_rows: 64,
};

pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(crate) fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

pub(crate) fn scale_f32(alpha: f32, y: &mut [f32]) {
    for y in y {
        *y *= alpha;
    }
}

pub(crate) fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

pub(crate) fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x.to_f32();
    }
}

fn panel_f32(w: &[f32], cols: usize, rows: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    for r in rows {
        let wr = &w[r * cols..(r + 1) * cols];
        for a in 0..n_act {
            out.put(a, r, dot_f32(wr, &x[a * cols..(a + 1) * cols]));
        }
    }
}

fn panel_f16(w: &[f16], cols: usize, rows: Range<usize>, x: &[f32], n_act: usize, out: &OutSink<'_>) {
    for r in rows {
        let wr = &w[r * cols..(r + 1) * cols];
        for a in 0..n_act {
            out.put(a, r, dot_f16(&x[a * cols..(a + 1) * cols], wr));
        }
    }
}

/// Runs a per-row dot product over the panel, summing each group of `group` activation rows.
#[inline]
fn panel_rows(rows: Range<usize>, n_act: usize, group: usize, out: &OutSink<'_>, dot: impl Fn(usize, usize) -> f32) {
    for r in rows {
        for i in 0..n_act / group {
            let mut v = 0.0;
            for g in 0..group {
                v += dot(r, i * group + g);
            }
            out.put(i, r, v);
        }
    }
}

/// Σ over blocks of `wd · ad · (Σ u·q − off·Σq) + wm · s`: unsigned weights `u`, offset `off`, Q4_1's min `wm`,
/// for output row `o`. With `group == 2` the output row has a high row `q1` and a residual row `q2` whose scale is
/// `d1 / 256`: the integer part is `256·(Σ u·q1 − off·Σq1) + (Σ u·q2 − off·Σq2)` and `ad` is the residual's scale.
#[inline]
fn dot32<B>(w: &[B], act: Act32<'_>, o: usize, group: usize, unpack: impl Fn(&B) -> ([u8; 32], i32, f32, f32)) -> f32 {
    let nb = w.len();
    let idot = |u: &[u8; 32], q: &[i8; 32]| (0..32).map(|k| u[k] as i32 * q[k] as i32).sum::<i32>();
    let mut sum = 0.0f32;
    for (b, wb) in w.iter().enumerate() {
        let (u, off, wd, wm) = unpack(wb);
        let (q, mut ad, s, isum) = act.block(o * group, nb, b);
        let mut t = idot(&u, q) - off * isum;
        if group == 2 {
            let (q2, ad2, _, isum2) = act.block(o * group + 1, nb, b);
            t = 256 * t + idot(&u, q2) - off * isum2;
            ad = ad2;
        }
        sum += wd * ad * t as f32 + wm * s;
    }
    sum
}

macro_rules! panel32 {
    ($name:ident, $block:ty, $unpack:expr) => {
        fn $name(
            w: &[$block],
            nb: usize,
            rows: Range<usize>,
            act: Act32<'_>,
            n_act: usize,
            group: usize,
            out: &OutSink<'_>,
        ) {
            assert!((group == 1 || group == 2) && n_act % group == 0);
            for r in rows {
                for o in 0..n_act / group {
                    out.put(o, r, dot32(&w[r * nb..(r + 1) * nb], act, o, group, $unpack));
                }
            }
        }
    };
}

// Q8_0 weights are signed: offsetting by 128 makes them unsigned, the offset is taken back through Σq.
panel32!(panel_q8_0, BlockQ8_0, |b: &BlockQ8_0| (b.qs.map(|q| (q as i32 + 128) as u8), 128, b.d.to_f32(), 0.0));
panel32!(panel_q4_0, BlockQ4_0, |b: &BlockQ4_0| (unpack_nibbles(&b.qs), 8, b.d.to_f32(), 0.0));
panel32!(panel_q4_1, BlockQ4_1, |b: &BlockQ4_1| (unpack_nibbles(&b.qs), 0, b.d.to_f32(), b.m.to_f32()));
panel32!(panel_q5_0, BlockQ5_0, |b: &BlockQ5_0| (unpack_q5_0(b), 16, b.d.to_f32(), 0.0));

/// Per super-block: `d · ad · Σ_j sc_j · Σ_{i∈j} u_i q_i  −  dmin · ad · Σ_j m_j · Σ_{i∈j} q_i`, with sub-blocks
/// of `sub` weights, signed scales `sc`, mins `m`, and an offset `off` subtracted from every quant (Q6_K's 32).
#[inline]
fn dotk<B>(
    w: &[B],
    act: &[BlockQ8K],
    sub: usize,
    unpack: impl Fn(&B) -> ([u8; 256], [i32; 16], [i32; 16], f32, f32, i32),
) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.iter().zip(act) {
        let (u, sc, m, d, dmin, off) = unpack(wb);
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..256 / sub {
            let mut dot = 0i32;
            for k in j * sub..(j + 1) * sub {
                dot += u[k] as i32 * ab.qs[k] as i32;
            }
            // Σq over the sub-block from the 16-wide bsums.
            let qsum: i32 = ab.bsums[j * sub / 16..(j + 1) * sub / 16].iter().map(|&b| b as i32).sum();
            isum += sc[j] * (dot - off * qsum);
            msum += m[j] * qsum;
        }
        sum += d * ab.d * isum as f32 - dmin * ab.d * msum as f32;
    }
    sum
}

macro_rules! panelk {
    ($name:ident, $block:ty, $sub:expr, $unpack:expr) => {
        fn $name(
            w: &[$block],
            nb: usize,
            rows: Range<usize>,
            act: &[BlockQ8K],
            n_act: usize,
            group: usize,
            out: &OutSink<'_>,
        ) {
            panel_rows(rows, n_act, group, out, |r, a| {
                dotk(&w[r * nb..(r + 1) * nb], &act[a * nb..(a + 1) * nb], $sub, $unpack)
            });
        }
    };
}

panelk!(panel_q4_k, BlockQ4K, 32, |b: &BlockQ4K| {
    let (sc, m) = q4k_scales_mins(&b.scales);
    let mut s = [0i32; 16];
    let mut mm = [0i32; 16];
    for j in 0..8 {
        s[j] = sc[j] as i32;
        mm[j] = m[j] as i32;
    }
    (unpack_q4_k(b), s, mm, b.d.to_f32(), b.dmin.to_f32(), 0)
});
panelk!(panel_q6_k, BlockQ6K, 16, |b: &BlockQ6K| {
    (unpack_q6_k(b), b.scales.map(|s| s as i32), [0; 16], b.d.to_f32(), 0.0, 32)
});
panelk!(panel_q2_k, BlockQ2K, 16, |b: &BlockQ2K| {
    (
        unpack_q2_k(b),
        b.scales.map(|s| (s & 0x0F) as i32),
        b.scales.map(|s| (s >> 4) as i32),
        b.d.to_f32(),
        b.dmin.to_f32(),
        0,
    )
});
