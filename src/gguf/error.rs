//! Everything that can be wrong with a GGUF file, each naming what and where.

use std::path::PathBuf;

use infer_kernels::GgmlType;

/// A GGUF file could not be read. Offsets are absolute byte offsets into the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The cause is part of the message and deliberately not a `#[source]` (nor a field named `source`): a chained
    /// cause is printed again by `{:#}`, which gave "PATH: Permission denied: Permission denied".
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error(
        "{path}: the file changed on disk since it was loaded ({was} bytes then, {now} now); load it again",
        now = now.map_or("missing".to_string(), |n| format!("{n} bytes"))
    )]
    FileChanged { path: PathBuf, was: u64, now: Option<u64> },
    #[error("{path}: is a directory, not a GGUF file")]
    IsDirectory { path: PathBuf },
    #[error("not a GGUF file: magic bytes are {found:?}, expected \"GGUF\"")]
    BadMagic { found: String },
    #[error("GGUF version {version} is not supported (only 2 and 3 are)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "GGUF version field {version:#010x} looks byte-swapped: this is a big-endian file, only little-endian is supported"
    )]
    WrongEndianness { version: u32 },
    #[error("file truncated while reading {what} at offset {offset}: needs {needed} bytes, {available} left")]
    UnexpectedEof { what: String, offset: u64, needed: u64, available: u64 },
    #[error("{field} = {value} at offset {offset} cannot fit in the file ({remaining} bytes left)")]
    CountTooLarge { field: &'static str, value: u64, offset: u64, remaining: u64 },
    #[error("metadata key #{index} at offset {offset} is empty")]
    EmptyKey { index: u64, offset: u64 },
    #[error("metadata key #{index} at offset {offset} {why}")]
    InvalidKey { index: u64, offset: u64, why: &'static str },
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key '{key}' at offset {offset}: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32, offset: u64 },
    #[error("metadata key '{key}' at offset {offset}: arrays of arrays are not supported")]
    NestedArray { key: String, offset: u64 },
    #[error("metadata key '{key}' at offset {offset}: bool byte is {byte}, must be 0 or 1")]
    InvalidBool { key: String, byte: u8, offset: u64 },
    #[error("{what} at offset {offset}: a string of {len} bytes exceeds the {limit}-byte limit")]
    StringTooLong { what: String, len: u64, limit: u64, offset: u64 },
    #[error("metadata key '{key}': the strings of the array at offset {offset} pass 4 GiB in total")]
    StringArrayTooLarge { key: String, offset: u64 },
    #[error("general.alignment = {value} is invalid: must be a power of two between 1 and 1 MiB")]
    InvalidAlignment { value: u64 },
    #[error("missing metadata key '{key}'")]
    MissingKey { key: String },
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    TypeMismatch { key: String, expected: &'static str, found: &'static str },
    #[error("metadata key '{key}' = {value} is out of range ({why})")]
    ValueOutOfRange { key: String, value: String, why: String },
    #[error("tensor #{index} at offset {offset}: name of {len} bytes is longer than {limit}")]
    TensorNameTooLong { index: u64, len: u64, limit: u64, offset: u64 },
    #[error("tensor #{index} at offset {offset}: name is not valid UTF-8")]
    InvalidTensorName { index: u64, offset: u64 },
    #[error("duplicate tensor name '{name}' (tensors #{first} and #{second})")]
    DuplicateTensor { name: String, first: u64, second: u64 },
    #[error("tensor '{name}': {n_dims} dimensions, must be 1 to 4")]
    BadDimCount { name: String, n_dims: u32 },
    #[error("tensor '{name}': dimension {dim} = {value} is invalid")]
    InvalidDim { name: String, dim: usize, value: u64 },
    #[error("tensor '{name}': element count of shape {shape:?} overflows")]
    ShapeOverflow { name: String, shape: Vec<u64> },
    #[error("tensor '{name}': type {ty}")]
    BadTensorType { name: String, ty: infer_kernels::TypeIdError },
    #[error("tensor '{name}': row length {ne0} is not a multiple of {ty}'s block size {block}")]
    RowNotBlockAligned { name: String, ty: GgmlType, ne0: u64, block: usize },
    #[error("tensor '{name}': data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor { name: String, offset: u64, alignment: u64 },
    #[error(
        "tensor '{name}': data [{start}, {end}) lies outside the file ({file_len} bytes); the file is truncated or corrupt, re-download it"
    )]
    TensorOutOfBounds { name: String, start: u64, end: u64, file_len: u64 },
    #[error("tensors '{first}' and '{second}' overlap in the data section")]
    OverlappingTensors { first: String, second: String },
    #[error("no tensor named '{name}'")]
    MissingTensor { name: String },
    #[error(
        "tensor '{name}' is not used by the {arch} decoder: this model variant is not supported (running without it would give wrong text)"
    )]
    UnusedTensor { name: String, arch: String },
    #[error("tensor '{name}': type {ty} ({id}) is not supported yet", id = ty.id())]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("tensor '{name}': shape {found:?}, expected {expected:?}")]
    WrongShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("writing GGUF: {what}")]
    Write { what: String },
}
