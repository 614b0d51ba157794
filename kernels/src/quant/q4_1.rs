//! Q4_1: blocks of 32 weights with an f16 scale and an f16 minimum; `x = d * q + m`, `q` in 0..=15.
//! 5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_1` (GGUF type 3). Nibble order as Q4_0: byte `j` holds weight `j` (low) and
//! weight `j + 16` (high). Dotted against 8-bit activations whose block sums are known, so the `m` term costs one
//! multiply per block.

use half::f16;

/// Weights per block.
pub const QK4_1: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (the value of q = 0).
    pub m: f16,
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
