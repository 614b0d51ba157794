//! Q8_K: super-blocks of 256 values with an f32 scale; `x = d * q`, plus the sum of each group of 16 quants.
//! 9.125 bits per value.
//!
//! Byte-identical to ggml's `block_q8_K` (GGUF type 15). Used only as the activation side of the K-quant dot
//! products: `bsums` lets the min terms of Q2_K/Q4_K be applied once per sub-block instead of once per weight.

use super::k_quants::QK_K;

/// One super-block of 256 activations.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Signed 8-bit quants.
    pub qs: [i8; QK_K],
    /// Sum of each consecutive group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
