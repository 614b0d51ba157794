//! GGUF files: reading (memory-mapped, zero-copy, validated before use) and writing.
//!
//! We read GGUF ourselves rather than through the gguf-rs crate: gguf-rs reads metadata through `std::io::Read`
//! into untyped values with anyhow errors, sizes tensors by guessing block sizes from type-id ranges, does not
//! check tensor data against the file length, and lets a duplicate key silently overwrite the first. A model file
//! is untrusted input, so the reader here checks every count and offset against the file before using it and
//! names the key, tensor and byte offset in every error.

mod error;
mod meta;
mod read;
mod strlist;
mod write;

pub use error::GgufError;
pub use meta::{MetaArray, MetaType, MetaValue, Metadata};
pub use read::{DEFAULT_ALIGNMENT, GgufFile, TensorInfo, tensor_extent};
pub use strlist::{StrList, StrListBuilder, StrListFull};
pub use write::{GgufStreamWriter, GgufWriter, TensorLayout};
