//! Shared geometry of the K-quant super-blocks (Q2_K, Q4_K, Q6_K, Q8_K): 256 weights per super-block.

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Rounds to the nearest integer, ties to even: the result of ggml's `nearest_int`, which adds 1.5 * 2^23 and reads
/// the mantissa, so it rounds in the FPU's default mode. The K-quant quantizers must round this way (not half away
/// from zero, as `f32::round` does) to produce the same bytes as llama.cpp.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// The 6-bit scale and 6-bit min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K (ggml's
/// `get_scale_min_k4`). Layout: bytes 0..4 hold the scales of sub-blocks 0..4 in their low 6 bits, bytes 4..8 the
/// mins of sub-blocks 0..4 likewise; sub-blocks 4..8 keep their low nibbles in bytes 8..12 (scale low, min high) and
/// their top two bits in the spare top bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc, m)
    }
}
