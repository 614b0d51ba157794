//! Q8_0: blocks of 32 weights with one f16 scale; `x = d * q`, `q` in -127..=127. 8.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q8_0` (GGUF type 8). Also the activation side of the 32-wide integer dot
//! products (Q4_0, Q4_1, Q5_0, Q8_0 weights).

use half::f16;

/// Weights per block.
pub const QK8_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Signed 8-bit quants.
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
