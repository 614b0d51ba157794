//! Checked quantization of f32 values into raw tensor bytes: the writer-side counterpart of
//! [`crate::dequant::dequantize`], for tools that produce GGUF files (a requantizer, test fixtures). Uses each
//! format's `quantize_row_ref`, so the bytes are llama.cpp's (see `tests/reference_quantize.rs` in the root crate).

use std::fmt;

use super::{Block, cast_blocks_mut, copy_blocks};
use crate::GgmlType;

/// Why [`quantize`] refused its input. Every variant names the type and the sizes involved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizeError {
    /// This crate has no quantizer for the type.
    Unsupported(GgmlType),
    /// The number of values is not a whole number of blocks.
    PartialBlock { ty: GgmlType, values: usize, block_values: usize },
    /// `out.len()` differs from the bytes the values quantize to.
    LengthMismatch { ty: GgmlType, values: usize, bytes: usize, out_len: usize },
}

impl fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QuantizeError::Unsupported(ty) => write!(f, "cannot quantize to type {ty} ({}): not supported", ty.id()),
            QuantizeError::PartialBlock { ty, values, block_values } => {
                write!(f, "{values} values are not a whole number of {ty} blocks of {block_values}")
            }
            QuantizeError::LengthMismatch { ty, values, bytes, out_len } => {
                write!(f, "{values} values quantize to {bytes} bytes of {ty}, but the output holds {out_len}")
            }
        }
    }
}

impl std::error::Error for QuantizeError {}

/// Whether [`quantize`] can produce this type.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q2_K | Q4_K | Q6_K | Q8_K)
}

/// Quantizes `x` to type `ty`, writing the little-endian GGUF bytes into `out`, which must be exactly
/// `ty.row_bytes(x.len())` long. Any alignment of `out` works (misaligned output goes through a temporary).
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantizeError> {
    if !can_quantize(ty) {
        return Err(QuantizeError::Unsupported(ty));
    }
    let block_values = ty.block_size();
    if !x.len().is_multiple_of(block_values) {
        return Err(QuantizeError::PartialBlock { ty, values: x.len(), block_values });
    }
    let bytes = (x.len() / block_values).checked_mul(ty.type_size());
    if bytes != Some(out.len()) {
        let bytes = bytes.unwrap_or(usize::MAX);
        return Err(QuantizeError::LengthMismatch { ty, values: x.len(), bytes, out_len: out.len() });
    }
    use GgmlType::*;
    match ty {
        F32 => into_blocks(out, |y: &mut [f32]| y.copy_from_slice(x)),
        F16 => into_blocks(out, |y| super::f16::quantize_row_ref(x, y)),
        BF16 => into_blocks(out, |y| super::bf16::quantize_row_ref(x, y)),
        Q8_0 => into_blocks(out, |y| super::q8_0::quantize_row_ref(x, y)),
        Q4_0 => into_blocks(out, |y| super::q4_0::quantize_row_ref(x, y)),
        Q4_1 => into_blocks(out, |y| super::q4_1::quantize_row_ref(x, y)),
        Q5_0 => into_blocks(out, |y| super::q5_0::quantize_row_ref(x, y)),
        Q2_K => into_blocks(out, |y| super::q2_k::quantize_row_ref(x, y)),
        Q4_K => into_blocks(out, |y| super::q4_k::quantize_row_ref(x, y)),
        Q6_K => into_blocks(out, |y| super::q6_k::quantize_row_ref(x, y)),
        Q8_K => into_blocks(out, |y| super::q8_k::quantize_row_ref(x, y)),
        _ => return Err(QuantizeError::Unsupported(ty)),
    }
    Ok(())
}

/// Runs `f` on `out` viewed as blocks: in place when aligned, else on an aligned temporary copied back after.
/// The caller has checked that `out` is a whole number of blocks.
fn into_blocks<T: Block>(out: &mut [u8], f: impl FnOnce(&mut [T])) {
    match cast_blocks_mut::<T>(out) {
        Some(blocks) => f(blocks),
        None => {
            // Start from the current bytes (any bytes are valid blocks); every block is overwritten by `f`.
            let mut tmp = copy_blocks::<T>(out).unwrap_or_default();
            f(&mut tmp);
            out.copy_from_slice(super::blocks_as_bytes(&tmp));
        }
    }
}
