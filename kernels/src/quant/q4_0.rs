//! Q4_0: blocks of 32 weights with one f16 scale; `x = d * (q - 8)`, `q` in 0..=15. 4.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q4_0` (GGUF type 2). Byte `j` of `qs` holds weight `j` in its low nibble and
//! weight `j + 16` in its high nibble. Dotted against Q8_0 activations.

use half::f16;

/// Weights per block.
pub const QK4_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
