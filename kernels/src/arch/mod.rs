//! The kernel implementations behind [`crate::dispatch`]: portable scalar code, x86-64 AVX2 / AVX-512 variants,
//! and the AMX tile kernel of the `amx` level.
//!
//! The weight-unpacking helpers here are the scalar statement of each block layout; the scalar kernels use them and
//! the SIMD kernels reproduce them lane by lane.

// Tiles index several arrays ([r][c] accumulators, per-row scales) with one loop counter on purpose.
#![allow(clippy::needless_range_loop)]

pub mod scalar;

#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_64;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/amx.rs"]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/amx_quant.rs"]
pub(crate) mod amx_quant;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/avx2.rs"]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/avx512.rs"]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/cache.rs"]
pub(crate) mod cache;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/packed256.rs"]
pub(crate) mod packed256;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/packed512.rs"]
pub(crate) mod packed512;
#[cfg(target_arch = "x86_64")]
#[path = "x86_64/peak.rs"]
pub(crate) mod peak;

use crate::quant::{BlockQ2K, BlockQ4K, BlockQ5_0, BlockQ6K};

/// The 32 nibbles of a Q4_0/Q4_1 block in weight order: byte `j` holds weight `j` (low) and `j + 16` (high).
#[inline]
pub(crate) fn unpack_nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut u = [0u8; 32];
    for j in 0..16 {
        u[j] = qs[j] & 0x0F;
        u[j + 16] = qs[j] >> 4;
    }
    u
}

/// Q5_0's 5-bit quants in 0..=31: the nibble plus bit `i` of `qh` as bit 4.
#[inline]
pub(crate) fn unpack_q5_0(b: &BlockQ5_0) -> [u8; 32] {
    let mut u = unpack_nibbles(&b.qs);
    let qh = u32::from_le_bytes(b.qh);
    for (i, v) in u.iter_mut().enumerate() {
        *v |= (((qh >> i) & 1) as u8) << 4;
    }
    u
}

/// Q4_K's eight 6-bit sub-block scales and mins, unpacked from their 12 bytes.
#[inline]
pub(crate) fn q4k_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, m)
}

/// Q4_K's 256 quants (0..=15) in weight order: 32-byte chunk `c` holds weights `64c..64c+32` in its low nibbles
/// and `64c+32..64c+64` in its high nibbles.
#[inline]
pub(crate) fn unpack_q4_k(b: &BlockQ4K) -> [u8; 256] {
    let mut u = [0u8; 256];
    for c in 0..4 {
        for l in 0..32 {
            let q = b.qs[32 * c + l];
            u[64 * c + l] = q & 0x0F;
            u[64 * c + 32 + l] = q >> 4;
        }
    }
    u
}

/// Q6_K's 256 quants (0..=63, the stored value before subtracting 32) in weight order.
#[inline]
pub(crate) fn unpack_q6_k(b: &BlockQ6K) -> [u8; 256] {
    let mut u = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&b.ql[64 * n..64 * n + 64], &b.qh[32 * n..32 * n + 32]);
        for l in 0..32 {
            let base = 128 * n + l;
            u[base] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            u[base + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            u[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            u[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    u
}

/// Q2_K's 256 quants (0..=3) in weight order: bit pair `2s` of byte `32n + l` is weight `128n + 32s + l`.
#[inline]
pub(crate) fn unpack_q2_k(b: &BlockQ2K) -> [u8; 256] {
    let mut u = [0u8; 256];
    for n in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                u[128 * n + 32 * s + l] = (b.qs[32 * n + l] >> (2 * s)) & 3;
            }
        }
    }
    u
}
