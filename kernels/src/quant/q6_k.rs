//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16; `x = d * sc * (q - 32)`, `q` in 0..=63, with a
//! signed 8-bit scale `sc` per sub-block. 6.5625 bits per weight.
//!
//! Byte-identical to ggml's `block_q6_K` (GGUF type 14). Each 128-weight half `n` uses `ql[64n..64n+64]` and
//! `qh[32n..32n+32]`: for `l` in 0..32, weights `128n + l`, `+32`, `+64`, `+96` take their low four bits from
//! `ql[64n + l] & 0xF`, `ql[64n + l + 32] & 0xF`, `ql[64n + l] >> 4`, `ql[64n + l + 32] >> 4`, and their high two
//! bits from bit pairs 0, 2, 4, 6 of `qh[32n + l]`. Dotted against Q8_K activations.

use half::f16;

use super::k_quants::QK_K;

/// One super-block of 256 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low four bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High two bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
