//! Checked dequantization of raw tensor bytes: the safe entry point the root crate uses for any supported tensor
//! type (embedding rows, norms, reference checks), whatever the buffer's alignment.

use std::fmt;

use crate::GgmlType;
use crate::quant::{self, Block};

/// Why [`dequantize`] refused its input. Every variant names the type and the sizes involved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DequantError {
    /// The type has no dequantizer in this crate (`GgmlType::is_supported()` is false).
    Unsupported(GgmlType),
    /// `data.len()` is not a whole number of blocks.
    PartialBlock { ty: GgmlType, bytes: usize, block_bytes: usize },
    /// `out.len()` differs from the number of values `data` holds.
    LengthMismatch { ty: GgmlType, bytes: usize, values: usize, out_len: usize },
}

impl fmt::Display for DequantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DequantError::Unsupported(ty) => {
                write!(f, "cannot dequantize type {ty} ({}): not supported yet", ty.id())
            }
            DequantError::PartialBlock { ty, bytes, block_bytes } => {
                write!(f, "{ty} data of {bytes} bytes is not a whole number of {block_bytes}-byte blocks")
            }
            DequantError::LengthMismatch { ty, bytes, values, out_len } => {
                write!(f, "{ty} data of {bytes} bytes holds {values} values, but the output has room for {out_len}")
            }
        }
    }
}

impl std::error::Error for DequantError {}

/// Dequantizes `data` (raw little-endian tensor bytes of type `ty`, as stored in GGUF) into `out`, which must hold
/// exactly the number of values `data` encodes. Works on any alignment: misaligned data is copied into an aligned
/// temporary first (mmapped GGUF tensors are normally aligned, so this is the rare path).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    if !ty.is_supported() {
        return Err(DequantError::Unsupported(ty));
    }
    let (block_bytes, block_values) = (ty.type_size(), ty.block_size());
    if !data.len().is_multiple_of(block_bytes) {
        return Err(DequantError::PartialBlock { ty, bytes: data.len(), block_bytes });
    }
    // Values can outnumber bytes (Q2_K: 84 bytes hold 256), so the product is checked.
    let values = (data.len() / block_bytes).checked_mul(block_values);
    if values != Some(out.len()) {
        let values = values.unwrap_or(usize::MAX);
        return Err(DequantError::LengthMismatch { ty, bytes: data.len(), values, out_len: out.len() });
    }
    use GgmlType::*;
    match ty {
        F32 => with_blocks::<f32>(data, |x| out.copy_from_slice(x)),
        F16 => with_blocks(data, |x| quant::f16::dequantize_row_ref(x, out)),
        BF16 => with_blocks(data, |x| quant::bf16::dequantize_row_ref(x, out)),
        Q8_0 => with_blocks(data, |x| quant::q8_0::dequantize_row_ref(x, out)),
        Q4_0 => with_blocks(data, |x| quant::q4_0::dequantize_row_ref(x, out)),
        Q4_1 => with_blocks(data, |x| quant::q4_1::dequantize_row_ref(x, out)),
        Q5_0 => with_blocks(data, |x| quant::q5_0::dequantize_row_ref(x, out)),
        Q2_K => with_blocks(data, |x| quant::q2_k::dequantize_row_ref(x, out)),
        Q4_K => with_blocks(data, |x| quant::q4_k::dequantize_row_ref(x, out)),
        Q6_K => with_blocks(data, |x| quant::q6_k::dequantize_row_ref(x, out)),
        Q8_K => with_blocks(data, |x| quant::q8_k::dequantize_row_ref(x, out)),
        // `is_supported()` was checked above; a type added there without an arm here is reported, not a panic.
        _ => return Err(DequantError::Unsupported(ty)),
    }
    Ok(())
}

/// Runs `f` on `data` viewed as blocks: in place when aligned, else on an aligned copy. The caller has checked
/// that `data` is a whole number of blocks (the type table and the struct sizes agree, see `table_matches_structs`).
fn with_blocks<T: Block>(data: &[u8], f: impl FnOnce(&[T])) {
    match quant::cast_blocks::<T>(data) {
        Some(blocks) => f(blocks),
        None => f(&quant::copy_blocks::<T>(data).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::*;
    use std::mem::size_of;

    #[test]
    fn table_matches_structs() {
        // `with_blocks` relies on the ggml type table and our struct sizes agreeing.
        let sizes = [
            (GgmlType::F32, size_of::<f32>()),
            (GgmlType::F16, size_of::<half::f16>()),
            (GgmlType::BF16, size_of::<half::bf16>()),
            (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
            (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
            (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
            (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
            (GgmlType::Q2_K, size_of::<BlockQ2K>()),
            (GgmlType::Q4_K, size_of::<BlockQ4K>()),
            (GgmlType::Q6_K, size_of::<BlockQ6K>()),
            (GgmlType::Q8_K, size_of::<BlockQ8K>()),
        ];
        for (ty, size) in sizes {
            assert_eq!(ty.type_size(), size, "{ty}");
            assert!(ty.is_supported(), "{ty}");
        }
        let supported = GgmlType::ALL.iter().filter(|t| t.is_supported()).count();
        assert_eq!(supported, sizes.len(), "a supported type is missing from dequantize");
    }
}
