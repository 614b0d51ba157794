//! Checked quantization of f32 values into raw tensor bytes: the writer-side counterpart of
//! [`crate::dequant::dequantize`], for tools that produce GGUF files (`infer quantize`, test fixtures).
//! [`quantize`] uses each format's `quantize_row_ref`, so the bytes are llama.cpp's (see
//! `tests/reference_quantize.rs` in the root crate); [`quantize_rows`] can also search each block's scale and weight
//! the error by the columns' importance.

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
    /// The row length does not divide the values into whole rows of whole blocks, or the importance vector is not
    /// one value per column.
    RowLength { ty: GgmlType, values: usize, row_len: usize, importance: Option<usize> },
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
            QuantizeError::RowLength { ty, values, row_len, importance: None } => {
                write!(f, "{values} values are not whole rows of {row_len} in whole {ty} blocks")
            }
            QuantizeError::RowLength { ty, values, row_len, importance: Some(n) } => {
                write!(f, "{n} importance values for rows of {row_len} ({values} values of {ty})")
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

/// How [`quantize_rows`] chooses each block's scale.
#[derive(Debug, Clone, Copy)]
pub enum Method<'a> {
    /// Each format's reference quantizer, byte-identical to llama.cpp's without an importance matrix: Q4_0, Q4_1,
    /// Q5_0 and Q8_0 round to the nearest level of a scale taken from the block's extremes; the K-quants already
    /// search their sub-block scales.
    Rtn,
    /// Q4_0, Q4_1 and Q5_0 search each block's scale (and minimum) for the least weighted squared error (see
    /// [`super::search`]). `importance`, one value per column (the mean square of the activation each column
    /// multiplies), weights that error; with it the K-quants weight their sub-block fits too. Q8_0, whose 255
    /// levels leave little to search, and F32/F16/BF16 quantize as with `Rtn`.
    Search { importance: Option<&'a [f32]> },
}

/// Quantizes `x` to type `ty`, writing the little-endian GGUF bytes into `out`, which must be exactly
/// `ty.row_bytes(x.len())` long. Any alignment of `out` works (misaligned output goes through a temporary).
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantizeError> {
    quantize_rows(ty, x, x.len(), out, Method::Rtn)
}

/// [`quantize`] of `x` as rows of `row_len` values (a whole number of blocks each), with a choice of [`Method`].
/// An importance vector has one value per column (`row_len` values).
pub fn quantize_rows(
    ty: GgmlType,
    x: &[f32],
    row_len: usize,
    out: &mut [u8],
    method: Method<'_>,
) -> Result<(), QuantizeError> {
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
    let importance = match method {
        Method::Search { importance } => importance,
        Method::Rtn => None,
    };
    let rows_fit = row_len > 0 && row_len.is_multiple_of(block_values) && x.len().is_multiple_of(row_len);
    if !rows_fit && !x.is_empty() || importance.is_some_and(|imp| imp.len() != row_len) {
        return Err(QuantizeError::RowLength {
            ty,
            values: x.len(),
            row_len,
            importance: importance.map(<[f32]>::len),
        });
    }
    if matches!(method, Method::Search { .. }) && matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q2_K | Q4_K | Q6_K) && !x.is_empty()
    {
        search_rows(ty, x, row_len, importance, out);
        return Ok(());
    }
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

/// [`Method::Search`] for a type that has it, row by row. The caller has checked the lengths.
fn search_rows(ty: GgmlType, x: &[f32], row_len: usize, importance: Option<&[f32]>, out: &mut [u8]) {
    use GgmlType::*;
    // The symmetric searches work on many blocks at a time, across rows.
    match ty {
        Q4_0 => return into_blocks(out, |y| super::q4_0::quantize_row_search(x, importance, y)),
        Q5_0 => return into_blocks(out, |y| super::q5_0::quantize_row_search(x, importance, y)),
        _ => {}
    }
    let row_bytes = row_len / ty.block_size() * ty.type_size();
    for (xr, or) in x.chunks_exact(row_len).zip(out.chunks_exact_mut(row_bytes)) {
        match (ty, importance) {
            (Q4_1, _) => into_blocks(or, |y| super::q4_1::quantize_row_search(xr, importance, y)),
            (Q2_K, Some(imp)) => into_blocks(or, |y| super::q2_k::quantize_row_weighted(xr, imp, y)),
            (Q4_K, Some(imp)) => into_blocks(or, |y| super::q4_k::quantize_row_weighted(xr, imp, y)),
            (Q6_K, Some(imp)) => into_blocks(or, |y| super::q6_k::quantize_row_weighted(xr, imp, y)),
            (Q2_K, None) => into_blocks(or, |y| super::q2_k::quantize_row_ref(xr, y)),
            (Q4_K, None) => into_blocks(or, |y| super::q4_k::quantize_row_ref(xr, y)),
            (Q6_K, None) => into_blocks(or, |y| super::q6_k::quantize_row_ref(xr, y)),
            _ => unreachable!("search_rows is only called for the types matched in quantize_with"),
        }
    }
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
