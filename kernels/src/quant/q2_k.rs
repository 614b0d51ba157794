//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16; `x = d * sc * q - dmin * m`, `q` in 0..=3, with a
//! 4-bit scale `sc` and 4-bit min `m` per sub-block. 2.625 bits per weight.
//!
//! Byte-identical to ggml's `block_q2_K` (GGUF type 10). `scales[i]` holds sub-block `i`'s scale (low nibble) and
//! min (high nibble). `qs` packs four 2-bit quants per byte: for each 128-weight half `n` (bytes `32n..32n+32`),
//! bit pair `2s` of byte `32n + l` is weight `128n + 32s + l`. Dotted against Q8_K activations.

use half::f16;

use super::k_quants::QK_K;

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Per-sub-block 4-bit scale (low nibble) and 4-bit min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
