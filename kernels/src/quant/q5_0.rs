//! Q5_0: blocks of 32 weights with one f16 scale; `x = d * (q - 16)`, `q` in 0..=31. 5.5 bits per weight.
//!
//! Byte-identical to ggml's `block_q5_0` (GGUF type 6). The low four bits of each quant are stored as in Q4_0
//! (byte `j`: weight `j` low, weight `j + 16` high); the fifth bit of weight `i` is bit `i` of the little-endian
//! u32 `qh`.

use half::f16;

/// Weights per block.
pub const QK5_0: usize = 32;

/// One block of 32 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, little-endian u32: bit `i` belongs to weight `i`.
    pub qh: [u8; 4],
    /// Low nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
