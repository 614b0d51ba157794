//! Parsing and validating a GGUF file.
//!
//! Every byte of a model file is untrusted. All reads go through a bounded cursor; every count is checked against
//! the bytes that remain before anything is allocated for it; every size and offset is computed with checked
//! arithmetic in one place ([`tensor_extent`]); and every tensor's data must lie inside the file, aligned and
//! not overlapping another, before the file is handed out. After `open` succeeds, tensor data can be sliced
//! without further checks.
//!
//! Clippy's `indexing_slicing`, `arithmetic_side_effects`, `unwrap_used` and `expect_used` are errors here: no
//! index, slice or sum on file-derived numbers may panic or wrap.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use infer_kernels::GgmlType;

use super::error::GgufError;
use super::meta::{MetaArray, MetaType, MetaValue, Metadata};
use super::strlist::StrListBuilder;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent (GGUF spec).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest accepted `general.alignment`.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Largest accepted single string (llama.cpp uses the same cap); it must also fit in the file.
pub const MAX_STRING_LEN: u64 = 1 << 30;
/// Longest metadata key (GGUF spec).
pub const MAX_KEY_LEN: usize = 65_535;
/// Longest tensor name (GGUF spec: at most 64 bytes).
pub const MAX_TENSOR_NAME: u64 = 64;
/// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;

/// One tensor's record from the tensor-info section.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the number of rows, ...
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row length (`ne[0]`).
    pub fn ne0(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of every dimension but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// Where the file's bytes live.
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open, validated GGUF file. Tensor data is served zero-copy from the memory map.
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    /// Length and modification time of a mapped file when it was opened (see [`GgufFile::check_unchanged`]).
    mapped_stamp: Option<(u64, Option<std::time::SystemTime>)>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and validates a file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), cause: source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(GgufError::IsDirectory { path: path.to_path_buf() });
        }
        let file = File::open(path).map_err(io)?;
        if meta.len() == 0 {
            // mmap of an empty file fails on some systems; an empty file is simply too short.
            return Self::parse(path.to_path_buf(), Storage::Owned(Vec::new()), None);
        }
        let storage = Storage::Mapped(map_file(&file).map_err(io)?);
        Self::parse(path.to_path_buf(), storage, Some((meta.len(), meta.modified().ok())))
    }

    /// Reads and validates a whole file into memory (`--no-mmap`): later changes to the file on disk cannot
    /// affect it, at the cost of the file's size in memory.
    pub fn read(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), cause: source };
        if std::fs::metadata(path).map_err(io)?.is_dir() {
            return Err(GgufError::IsDirectory { path: path.to_path_buf() });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        Self::parse(path.to_path_buf(), Storage::Owned(bytes), None)
    }

    /// Validates a file held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(PathBuf::from("<memory>"), Storage::Owned(bytes), None)
    }

    /// Whether the mapped file still has the length and modification time it had when opened. Anything reading
    /// the map after the file changed would read bytes nobody validated (or, past a new end, fault), so a
    /// generation checks this before it starts. Always true for a file read into memory.
    pub fn check_unchanged(&self) -> Result<(), GgufError> {
        let Some((len, modified)) = self.mapped_stamp else { return Ok(()) };
        let now = std::fs::metadata(&self.path).map(|m| (m.len(), m.modified().ok()));
        match now {
            Ok((l, m)) if l == len && m == modified => Ok(()),
            Ok((l, _)) => Err(GgufError::FileChanged { path: self.path.clone(), was: len, now: Some(l) }),
            Err(_) => Err(GgufError::FileChanged { path: self.path.clone(), was: len, now: None }),
        }
    }

    fn parse(
        path: PathBuf,
        storage: Storage,
        mapped_stamp: Option<(u64, Option<std::time::SystemTime>)>,
    ) -> Result<GgufFile, GgufError> {
        let parsed = parse_layout(storage.bytes())?;
        let by_name = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            path,
            storage,
            mapped_stamp,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The position of the tensor named `name` in [`GgufFile::tensors`], if present.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The tensor named `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The tensor named `name`, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_info(name).ok_or_else(|| GgufError::MissingTensor { name: name.to_string() })
    }

    /// The raw bytes of a tensor's data (zero-copy). `info` must come from this file.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        // Bounds were validated when the file was opened (`parse_layout`), so this cannot overflow or leave the
        // file; checked arithmetic and `get` keep a foreign `TensorInfo` from panicking all the same.
        let range = tensor_range(self.data_offset, info.offset, info.n_bytes);
        range.and_then(|r| self.storage.bytes().get(r)).unwrap_or(&[])
    }

    /// The whole file (header included): tensor byte ranges computed from `data_offset() + offset` index into it.
    pub fn raw_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Drops this process's resident pages of the mapped bytes `range` (those of a tensor repacked at load, which
    /// nothing reads from the map again), so that the repacked copy is not a second resident copy of the weights.
    /// The pages stay in the page cache, and a later read of them simply faults them back in, from the file.
    /// Only whole 4 KiB pages inside `range` are dropped. A file read into memory (`--no-mmap`) keeps its bytes.
    pub fn release(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let Storage::Mapped(map) = &self.storage else { return };
        // A map starts on a page boundary, so offsets into it are page-aligned where the address is.
        let start = range.start.checked_next_multiple_of(PAGE);
        let end = range.end.min(map.len()).checked_div(PAGE).and_then(|p| p.checked_mul(PAGE));
        if let (Some(start), Some(end)) = (start, end)
            && let Some(len) = end.checked_sub(start).filter(|&l| l > 0)
        {
            // Advice only: if the kernel refuses it, the pages simply stay resident.
            let _ = release_pages(map, start, len);
        }
    }

    /// The sum of all tensor elements: the model's parameter count.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements).sum()
    }

    /// Bytes of tensor data.
    pub fn tensor_bytes_total(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

/// Byte range `data_offset + offset .. + n_bytes` in the file, if it can be computed.
fn tensor_range(data_offset: u64, offset: u64, n_bytes: u64) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(data_offset.checked_add(offset)?).ok()?;
    let end = start.checked_add(usize::try_from(n_bytes).ok()?)?;
    Some(start..end)
}

#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private. Its contents are undefined if another process truncates or
    // rewrites the file while we run (a risk every mmap-based loader shares, documented in the README); we never
    // write through it, and every offset into it was validated against its length at open.
    unsafe { memmap2::MmapOptions::new().map(file) }
}

#[allow(unsafe_code)]
fn release_pages(map: &memmap2::Mmap, offset: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: the map is private and read-only (`map_file`), so it has no changes of ours that MADV_DONTNEED could
    // discard: the pages are dropped from this process and the next access reads the same bytes from the file
    // again (or from the page cache), which is what any reference into the map already relies on. The range lies
    // inside the map and starts on a page boundary, so no byte outside it is dropped (on a machine with larger
    // pages memmap2 rounds the start down, which only drops pages that fault back in unchanged).
    unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) }
}

struct Layout {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounded little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::UnexpectedEof {
                what: what(),
                offset: self.offset(),
                needed: n,
                available: self.remaining(),
            });
        }
        // `n` fits: it is at most what remains of a slice.
        let end = self.pos.saturating_add(n as usize);
        let out = self.buf.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed byte string, bounded by the file and by `MAX_STRING_LEN`.
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let at = self.offset();
        let len = self.u64(|| format!("length of {}", what()))?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::StringTooLong { what: what(), len, limit: MAX_STRING_LEN, offset: at });
        }
        self.take(len, what)
    }
}

fn parse_layout(buf: &[u8]) -> Result<Layout, GgufError> {
    let mut c = Cursor { buf, pos: 0 };

    let magic = c.array::<4>(|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic.escape_ascii().to_string() });
    }
    let version = c.u32(|| "version".into())?;
    if version != 2 && version != 3 {
        if version != 0 && version & 0xFFFF == 0 {
            return Err(GgufError::WrongEndianness { version });
        }
        return Err(GgufError::UnsupportedVersion { version });
    }

    let at = c.offset();
    let n_tensors = c.u64(|| "tensor count".into())?;
    let n_kv = c.u64(|| "metadata count".into())?;
    // A tensor record is at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes, a
    // key-value pair at least 8 + 1 (key) + 4 (type) + 1 (value). Counts beyond what the file can hold are lies.
    if n_tensors > c.remaining() / 32 {
        return Err(GgufError::CountTooLarge {
            field: "n_tensors",
            value: n_tensors,
            offset: at,
            remaining: c.remaining(),
        });
    }
    if n_kv > c.remaining() / 14 {
        return Err(GgufError::CountTooLarge {
            field: "n_kv",
            value: n_kv,
            offset: at.saturating_add(8),
            remaining: c.remaining(),
        });
    }

    let mut metadata = Metadata::new();
    for index in 0..n_kv {
        let key_at = c.offset();
        let key_bytes = c.string_bytes(&|| format!("metadata key #{index}"))?;
        if key_bytes.is_empty() {
            return Err(GgufError::EmptyKey { index, offset: key_at });
        }
        // Keys are ASCII (GGUF spec): anything else is a damaged or hostile file, and keys end up in messages.
        if key_bytes.len() > MAX_KEY_LEN {
            return Err(GgufError::InvalidKey { index, offset: key_at, why: "is longer than 65535 bytes" });
        }
        if !key_bytes.iter().all(u8::is_ascii_graphic) {
            return Err(GgufError::InvalidKey { index, offset: key_at, why: "is not printable ASCII" });
        }
        let key = String::from_utf8_lossy(key_bytes).into_owned();
        if metadata.contains(&key) {
            return Err(GgufError::DuplicateKey { key, offset: key_at });
        }
        let type_at = c.offset();
        let type_id = c.u32(|| format!("type of metadata key '{key}'"))?;
        let ty = MetaType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
            offset: type_at,
        })?;
        let value = read_value(&mut c, &key, ty)?;
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) => {
            let a = *a as u64;
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(GgufError::InvalidAlignment { value: a });
            }
            a
        }
        Some(other) => {
            return Err(GgufError::TypeMismatch {
                key: "general.alignment".into(),
                expected: "u32",
                found: other.type_name(),
            });
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut seen: HashMap<String, u64> = HashMap::with_capacity(n_tensors as usize);
    for index in 0..n_tensors {
        let name_at = c.offset();
        let name_bytes = c.string_bytes(&|| format!("name of tensor #{index}"))?;
        if name_bytes.len() as u64 > MAX_TENSOR_NAME {
            return Err(GgufError::TensorNameTooLong {
                index,
                len: name_bytes.len() as u64,
                limit: MAX_TENSOR_NAME,
                offset: name_at,
            });
        }
        let name = std::str::from_utf8(name_bytes)
            .map_err(|_| GgufError::InvalidTensorName { index, offset: name_at })?
            .to_string();
        if let Some(&first) = seen.get(&name) {
            return Err(GgufError::DuplicateTensor { name, first, second: index });
        }
        let n_dims = c.u32(|| format!("dimension count of tensor '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::BadDimCount { name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims as usize {
            let value = c.u64(|| format!("dimension {d} of tensor '{name}'"))?;
            // ggml stores dimensions as int64: anything with the top bit set is negative.
            if value > i64::MAX as u64 {
                return Err(GgufError::InvalidDim { name, dim: d, value });
            }
            dims.push(value);
        }
        let type_id = c.u32(|| format!("type of tensor '{name}'"))?;
        let ty = GgmlType::from_id(type_id).map_err(|ty| GgufError::BadTensorType { name: name.clone(), ty })?;
        let offset = c.u64(|| format!("data offset of tensor '{name}'"))?;
        let (n_elements, n_bytes) = tensor_extent(&name, &dims, ty)?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor { name, offset, alignment });
        }
        seen.insert(name.clone(), index);
        tensors.push(TensorInfo { name, dims, ty, offset, n_elements, n_bytes });
    }

    // The data section starts at the next multiple of the alignment after the tensor infos.
    let data_offset = c.offset().checked_next_multiple_of(alignment).unwrap_or(u64::MAX);
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start: data_offset.saturating_add(t.offset),
                    end: data_offset.saturating_add(t.offset).saturating_add(t.n_bytes),
                    file_len,
                });
            }
        }
    }
    // No two tensors may share bytes: one tensor must never alias another's data.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        if let [a, b] = pair
            && a.offset.checked_add(a.n_bytes).is_none_or(|end| end > b.offset)
        {
            return Err(GgufError::OverlappingTensors { first: a.name.clone(), second: b.name.clone() });
        }
    }

    Ok(Layout { version, metadata, tensors, alignment, data_offset })
}

/// Element count and byte size of a tensor, checked: the one place these are computed.
pub fn tensor_extent(name: &str, dims: &[u64], ty: GgmlType) -> Result<(u64, u64), GgufError> {
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::ShapeOverflow { name: name.to_string(), shape: dims.to_vec() })?;
    let block = ty.block_size() as u64;
    let ne0 = dims.first().copied().unwrap_or(1);
    if block == 0 || !ne0.is_multiple_of(block) {
        return Err(GgufError::RowNotBlockAligned { name: name.to_string(), ty, ne0, block: ty.block_size() });
    }
    let n_bytes = n_elements
        .checked_div(block)
        .and_then(|blocks| blocks.checked_mul(ty.type_size() as u64))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::ShapeOverflow { name: name.to_string(), shape: dims.to_vec() })?;
    Ok((n_elements, n_bytes))
}

fn read_value(c: &mut Cursor, key: &str, ty: MetaType) -> Result<MetaValue, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match ty {
        MetaType::U8 => MetaValue::U8(c.u8(what)?),
        MetaType::I8 => MetaValue::I8(c.u8(what)? as i8),
        MetaType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(what)?)),
        MetaType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(what)?)),
        MetaType::U32 => MetaValue::U32(c.u32(what)?),
        MetaType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(what)?)),
        MetaType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(what)?)),
        MetaType::U64 => MetaValue::U64(c.u64(what)?),
        MetaType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(what)?)),
        MetaType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(what)?)),
        MetaType::Bool => MetaValue::Bool(read_bool(c, key)?),
        MetaType::String => MetaValue::String(read_string(c, key)?),
        MetaType::Array => MetaValue::Array(read_array(c, key)?),
    })
}

/// The first `N` bytes of `b` as an array (zero-filled if `b` is shorter, which callers rule out).
fn le_bytes<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, v) in out.iter_mut().zip(b) {
        *o = *v;
    }
    out
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool, GgufError> {
    let at = c.offset();
    match c.u8(|| format!("value of metadata key '{key}'"))? {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::InvalidBool { key: key.to_string(), byte, offset: at }),
    }
}

fn read_string(c: &mut Cursor, key: &str) -> Result<String, GgufError> {
    let bytes = c.string_bytes(&|| format!("string in metadata key '{key}'"))?;
    // Text values are UTF-8 by the spec; a stray invalid byte is kept visible as U+FFFD rather than failing the
    // whole file, and anything that needs exact text (the vocabulary) checks for it where it is used.
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

fn read_array(c: &mut Cursor, key: &str) -> Result<MetaArray, GgufError> {
    let at = c.offset();
    let type_id = c.u32(|| format!("element type of array '{key}'"))?;
    let elem = MetaType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset: at,
    })?;
    if elem == MetaType::Array {
        return Err(GgufError::NestedArray { key: key.to_string(), offset: at });
    }
    let len_at = c.offset();
    let n = c.u64(|| format!("length of array '{key}'"))?;
    // Checked in O(1) before any allocation: every element takes at least `min_size` bytes.
    if n > c.remaining().checked_div(elem.min_size()).unwrap_or(0) {
        return Err(GgufError::CountTooLarge {
            field: "array length",
            value: n,
            offset: len_at,
            remaining: c.remaining(),
        });
    }
    let n = n as usize;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            const SIZE: usize = std::mem::size_of::<$t>();
            // `n` elements fit in what remains (checked above), so the product cannot overflow.
            let bytes = c.take(n.saturating_mul(SIZE) as u64, || format!("array '{key}'"))?;
            MetaArray::$variant(bytes.chunks_exact(SIZE).map(|b| <$t>::from_le_bytes(le_bytes::<SIZE>(b))).collect())
        }};
    }
    Ok(match elem {
        MetaType::U8 => MetaArray::U8(c.take(n as u64, || format!("array '{key}'"))?.to_vec()),
        MetaType::I8 => fixed!(I8, i8),
        MetaType::U16 => fixed!(U16, u16),
        MetaType::I16 => fixed!(I16, i16),
        MetaType::U32 => fixed!(U32, u32),
        MetaType::I32 => fixed!(I32, i32),
        MetaType::F32 => fixed!(F32, f32),
        MetaType::U64 => fixed!(U64, u64),
        MetaType::I64 => fixed!(I64, i64),
        MetaType::F64 => fixed!(F64, f64),
        MetaType::Bool => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_bool(c, key)?);
            }
            MetaArray::Bool(v)
        }
        MetaType::String => {
            // One buffer for all the strings: their text is at most what remains of the file (grown only where
            // invalid UTF-8 becomes U+FFFD), and each costs 4 bytes of offset instead of a String and an allocation.
            let full = |_| GgufError::StringArrayTooLarge { key: key.to_string(), offset: at };
            // A vocabulary's strings average under 10 bytes; beyond 16 MiB (a declared count is only bounded by
            // the file's length) the buffer grows as the strings arrive.
            let text_guess = n.saturating_mul(10).min(16 << 20);
            let mut v = StrListBuilder::with_capacity(n, text_guess);
            for _ in 0..n {
                let bytes = c.string_bytes(&|| format!("string in metadata key '{key}'"))?;
                v.push_lossy(bytes).map_err(full)?;
            }
            MetaArray::String(v.finish().map_err(full)?)
        }
        MetaType::Array => unreachable!("nested arrays rejected above"),
    })
}
