//! One module per block format: the `#[repr(C)]` block struct (byte-identical to ggml's), its layout and formula,
//! quantize, dequantize, and the scalar `_ref` dot product that is the specification every SIMD variant is tested
//! against.
//!
//! This module also holds the one audited place where raw bytes (an mmapped GGUF tensor, an output buffer) are
//! reinterpreted as typed blocks: [`cast_blocks`], [`cast_blocks_mut`], [`copy_blocks`] and [`blocks_as_bytes`],
//! all bounded by the sealed [`Block`] trait.

pub mod bf16;
pub mod convert;
pub mod f16;
pub mod k_quants;
pub mod q2_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
pub mod search;

pub use convert::{Method, QuantizeError, can_quantize, quantize, quantize_rows};
pub use k_quants::QK_K;
pub use q2_k::BlockQ2K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_k::BlockQ8K;

use std::mem::{align_of, size_of};

// The block structs hold their f16/f32/i16 fields in host byte order, and GGUF stores them little-endian, so the
// zero-copy views below are only correct on little-endian hosts (every target we build for).
#[cfg(target_endian = "big")]
compile_error!("infer-kernels reinterprets little-endian GGUF bytes in place; big-endian targets are not supported");

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element of tensor data: one quant block, or one f32/f16/bf16 value.
///
/// Sealed: implemented only for types that (1) are `#[repr(C)]` (or primitive) with every field an integer, an
/// integer array, `f32` or `half::f16`/`bf16`, so *every* bit pattern is a valid value; (2) have no padding bytes
/// (each block struct's compile-time size assert equals the sum of its field sizes); (3) hold no pointers,
/// references or interior mutability. These are exactly the properties [`cast_blocks`] and friends rely on.
pub trait Block: sealed::Sealed + Copy + Send + Sync + 'static {}

macro_rules! impl_block {
    ($($t:ty),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl Block for $t {}
        )*
    };
}
impl_block!(
    BlockQ8_0,
    BlockQ4_0,
    BlockQ4_1,
    BlockQ5_0,
    BlockQ2K,
    BlockQ4K,
    BlockQ6K,
    BlockQ8K,
    f32,
    half::f16,
    half::bf16
);

/// Views `bytes` as a slice of blocks without copying, or `None` if its length is not a whole number of blocks or
/// its address is not aligned for `T` (see [`copy_blocks`] for the fallback).
pub fn cast_blocks<T: Block>(bytes: &[u8]) -> Option<&[T]> {
    if !bytes.len().is_multiple_of(size_of::<T>()) || !(bytes.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
        return None;
    }
    // SAFETY: the pointer is non-null and aligned for T (checked above); the slice covers exactly
    // `bytes.len() / size_of::<T>()` whole Ts inside one live allocation; `T: Block` guarantees every bit pattern
    // is a valid T and T has no interior mutability, so reading these initialised bytes as T is sound; the result
    // borrows `bytes`, so the memory can be neither freed nor mutated while it lives.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size_of::<T>()) })
}

/// Views `bytes` as a mutable slice of blocks without copying (for quantizing straight into an output buffer), or
/// `None` on a partial block or misaligned address.
pub fn cast_blocks_mut<T: Block>(bytes: &mut [u8]) -> Option<&mut [T]> {
    if !bytes.len().is_multiple_of(size_of::<T>()) || !(bytes.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
        return None;
    }
    // SAFETY: as in `cast_blocks` for size, alignment and validity. In addition, T has no padding (`Block`), so
    // any T written through the result leaves every byte initialised and `bytes` stays a valid `[u8]`; the
    // exclusive borrow of `bytes` is moved into the result, so there is no aliasing.
    Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size_of::<T>()) })
}

/// Copies `bytes` into a freshly allocated (so aligned) vector of blocks: the fallback when [`cast_blocks`]
/// refuses a misaligned buffer. `None` if the length is not a whole number of blocks.
pub fn copy_blocks<T: Block>(bytes: &[u8]) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(size_of::<T>()) {
        return None;
    }
    let n = bytes.len() / size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: the vector owns capacity for n Ts, i.e. `bytes.len()` bytes, aligned for T; source and destination
    // are distinct allocations; after the copy all n Ts are initialised from arbitrary bytes, which `T: Block`
    // makes valid, so setting the length to n is sound.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len());
        v.set_len(n);
    }
    Some(v)
}

/// The raw bytes of a slice of blocks, as they are stored in a GGUF file (for writers and checksums).
pub fn blocks_as_bytes<T: Block>(blocks: &[T]) -> &[u8] {
    // SAFETY: T has no padding (`Block`), so all `size_of_val(blocks)` bytes are initialised; u8 has alignment 1
    // and every bit pattern is a valid u8; the result borrows `blocks` immutably, and T has no interior
    // mutability, so the bytes cannot change while it lives.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte buffer whose start is 8-aligned, so offset 0 is aligned for every block type and offset 1 is not.
    #[repr(C, align(8))]
    struct Aligned([u8; 512]);

    #[test]
    fn cast_checks_length_and_alignment() {
        let buf = Aligned([0; 512]);
        let bytes = &buf.0[..];
        assert_eq!(cast_blocks::<BlockQ8_0>(&bytes[..34 * 3]).map(<[_]>::len), Some(3));
        assert!(cast_blocks::<BlockQ8_0>(&bytes[..34 * 3 + 1]).is_none(), "partial block");
        assert!(cast_blocks::<BlockQ8_0>(&bytes[1..34 * 3 + 1]).is_none(), "misaligned for f16");
        assert!(cast_blocks::<BlockQ8K>(&bytes[2..2 + 292]).is_none(), "misaligned for f32");
        assert_eq!(cast_blocks::<f32>(&bytes[4..]).map(<[_]>::len), Some(127));
        assert_eq!(cast_blocks::<BlockQ8K>(&bytes[..0]).map(<[_]>::len), Some(0));
        let copied = copy_blocks::<BlockQ8_0>(&bytes[1..34 * 3 + 1]).unwrap();
        assert_eq!(copied.len(), 3);
        assert!(copy_blocks::<BlockQ8_0>(&bytes[1..34]).is_none());
    }

    #[test]
    fn cast_mut_writes_ggml_byte_layout() {
        let mut buf = Aligned([0; 512]);
        let blocks = cast_blocks_mut::<BlockQ4_0>(&mut buf.0[..18 * 4]).unwrap();
        blocks[1].d = half::f16::ONE;
        blocks[1].qs[0] = 0xAB;
        // Block 1 starts at byte 18: little-endian f16 1.0 is 0x3C00, then the first quant byte.
        assert_eq!(&buf.0[18..21], &[0x00, 0x3C, 0xAB]);
        let copied = copy_blocks::<BlockQ4_0>(&buf.0[..18 * 4]).unwrap();
        assert_eq!(blocks_as_bytes(&copied), &buf.0[..18 * 4]);
        assert!(cast_blocks_mut::<BlockQ4_0>(&mut buf.0[1..19]).is_none());
    }
}
