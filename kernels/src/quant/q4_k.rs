//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, `q` in 0..=15, with a
//! 6-bit scale `sc` and 6-bit min `m` per sub-block. 4.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_K` (GGUF type 12). The eight 6-bit scales and eight 6-bit mins are packed
//! into 12 bytes (`scales`): for sub-block `j < 4`, `sc = scales[j] & 63`, `m = scales[j + 4] & 63`; for `j >= 4`,
//! `sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4)` and `m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)`.
//! `qs` holds 64-weight chunks of 32 bytes: byte `l` of chunk `c` has weight `64c + l` (low nibble) and
//! `64c + 32 + l` (high nibble). Dotted against Q8_K activations.

use half::f16;

use super::k_quants::{K_SCALE_SIZE, QK_K};

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
