//! Shared geometry of the K-quant super-blocks (Q2_K, Q4_K, Q6_K, Q8_K): 256 weights per super-block.

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K.
pub const K_SCALE_SIZE: usize = 12;
