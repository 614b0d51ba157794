//! Writing GGUF v3 files that llama.cpp and gguf-py read: [`GgufWriter`] builds a file in memory (the tests' tiny
//! synthetic models), [`GgufStreamWriter`] writes one tensor at a time (`infer quantize`, whose models need not fit
//! in memory twice).
//!
//! Files are written atomically: to a temporary file beside the target, flushed and fsynced, then renamed, so a
//! failed or interrupted write never leaves a half-written model under the real name.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use infer_kernels::GgmlType;

use super::error::GgufError;
use super::meta::{MetaArray, MetaValue, Metadata};
use super::read::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ALIGNMENT, tensor_extent};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory and writes it out.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets a metadata key (replacing an earlier value).
    pub fn set(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.set(key, value);
        self
    }

    /// Removes a metadata key, if present.
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.metadata.remove(key);
        self
    }

    pub fn set_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.set(key, MetaValue::String(value.to_string()))
    }

    pub fn set_u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.set(key, MetaValue::U32(value))
    }

    pub fn set_f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.set(key, MetaValue::F32(value))
    }

    pub fn set_bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.set(key, MetaValue::Bool(value))
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Copies every key of `metadata` (e.g. from a source model being quantized).
    pub fn copy_metadata(&mut self, metadata: &Metadata) -> &mut Self {
        for (k, v) in metadata.iter() {
            self.metadata.set(k, v.clone());
        }
        self
    }

    /// Adds a tensor; `dims` in ggml order (row length first). `data` must be exactly the tensor's byte size.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Result<(), GgufError> {
        let n_bytes = check_tensor(self.tensors.iter().map(|t| t.name.as_str()), name, dims, ty)?;
        if n_bytes != data.len() as u64 {
            return Err(GgufError::Write {
                what: format!(
                    "tensor '{name}' of type {ty} and shape {dims:?} needs {n_bytes} bytes, got {}",
                    data.len()
                ),
            });
        }
        self.tensors.push(PendingTensor { name: name.to_string(), dims: dims.to_vec(), ty, data });
        Ok(())
    }

    /// Adds an f32 tensor.
    pub fn add_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) -> Result<(), GgufError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, data)
    }

    /// Serialises the file.
    pub fn write_to(&self, out: &mut impl Write) -> Result<(), GgufError> {
        let alignment = alignment(&self.metadata)?;
        let io = |e: io::Error| GgufError::Write { what: e.to_string() };
        let mut w = CountingWriter { inner: out, written: 0 };
        let layout: Vec<TensorLayout> = self
            .tensors
            .iter()
            .map(|t| TensorLayout { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty })
            .collect();
        let sizes: Vec<u64> = self.tensors.iter().map(|t| t.data.len() as u64).collect();
        let offsets = write_header(&mut w, &self.metadata, &layout, &sizes, alignment).map_err(io)?;
        let data_start = w.written;
        for (t, off) in self.tensors.iter().zip(offsets) {
            w.pad_to_absolute(data_start + off).map_err(io)?;
            w.put(&t.data).map_err(io)?;
        }
        if !self.tensors.is_empty() {
            w.pad_to(alignment).map_err(io)?;
        }
        w.inner.flush().map_err(io)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file atomically (temporary file, fsync, rename).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let mut tmp = TempFile::create(path.as_ref())?;
        let io = |source| GgufError::Io { path: path.as_ref().to_path_buf(), cause: source };
        let mut buffered = BufWriter::new(tmp.file.try_clone().map_err(io)?);
        self.write_to(&mut buffered)?;
        buffered.into_inner().map_err(|e| io(e.into_error()))?;
        tmp.commit()
    }
}

/// A tensor's entry in a file written by [`GgufStreamWriter`]: name, dimensions in ggml order (row length first)
/// and type. Its data follows later.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorLayout {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// Writes a GGUF file tensor by tensor, so that a model being converted is never held in memory whole: the header
/// (metadata and every tensor's type, shape and offset) goes first, then each tensor's bytes at its offset, in
/// any order and in parts if need be. The file appears under its name only when [`finish`](Self::finish) succeeds; dropping the writer
/// before that (an error, Ctrl-C) removes the temporary file.
pub struct GgufStreamWriter {
    tmp: TempFile,
    out: CountingWriter<BufWriter<File>>,
    layout: Vec<TensorLayout>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    data_start: u64,
    alignment: u64,
    /// Bytes of each tensor written so far.
    placed: Vec<u64>,
}

impl GgufStreamWriter {
    /// Creates the temporary file beside `path` and writes the header for `tensors`.
    pub fn create(path: impl AsRef<Path>, metadata: &Metadata, tensors: Vec<TensorLayout>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let alignment = alignment(metadata)?;
        let mut sizes = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            sizes.push(check_tensor(tensors[..i].iter().map(|t| t.name.as_str()), &t.name, &t.dims, t.ty)?);
        }
        let tmp = TempFile::create(path)?;
        let io = |source| GgufError::Io { path: path.to_path_buf(), cause: source };
        let file = tmp.file.try_clone().map_err(io)?;
        let mut out = CountingWriter { inner: BufWriter::with_capacity(1 << 20, file), written: 0 };
        let offsets = write_header(&mut out, metadata, &tensors, &sizes, alignment).map_err(io)?;
        let data_start = out.written;
        let placed = vec![0; tensors.len()];
        Ok(GgufStreamWriter { tmp, out, layout: tensors, sizes, offsets, data_start, alignment, placed })
    }

    /// Writes `data` at byte `offset` of tensor `index`'s data. Tensors, and parts of them, may come in any order
    /// (a converter may finish them out of the layout's order), but every byte of every tensor must be written
    /// once. The padding between tensors is left unwritten: it reads as zeros.
    pub fn write_at(&mut self, index: usize, offset: u64, data: &[u8]) -> Result<(), GgufError> {
        let Some(t) = self.layout.get(index) else {
            return Err(GgufError::Write { what: format!("no tensor {index} of {}", self.layout.len()) });
        };
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= self.sizes[index]);
        if end.is_none() || self.placed[index] + data.len() as u64 > self.sizes[index] {
            return Err(GgufError::Write {
                what: format!(
                    "tensor '{}' has {} bytes: cannot write {} more at {offset}",
                    t.name,
                    self.sizes[index],
                    data.len()
                ),
            });
        }
        let target = self.data_start + self.offsets[index] + offset;
        let out = &mut self.out.inner;
        let result = out.flush().and_then(|()| {
            let file = out.get_mut();
            file.seek(SeekFrom::Start(target))?;
            file.write_all(data)
        });
        result.map_err(|source| GgufError::Io { path: self.tmp.target.clone(), cause: source })?;
        self.placed[index] += data.len() as u64;
        Ok(())
    }

    /// Starts the data written so far on its way to the disk (and waits for it), so that
    /// [`finish`](Self::finish)'s sync has less left to do: a producer's writer thread can call this while the
    /// next data is being made.
    pub fn sync_data(&mut self) -> Result<(), GgufError> {
        let out = &mut self.out.inner;
        let result = out.flush().and_then(|()| out.get_ref().sync_data());
        result.map_err(|source| GgufError::Io { path: self.tmp.target.clone(), cause: source })
    }

    /// Checks that every tensor was written, then flushes, fsyncs and renames the file into place.
    pub fn finish(mut self) -> Result<(), GgufError> {
        let written = self.placed.iter().zip(&self.sizes).filter(|(p, s)| p == s).count();
        if written != self.layout.len() {
            return Err(GgufError::Write {
                what: format!("only {written} of {} tensors were written", self.layout.len()),
            });
        }
        let io = |source| GgufError::Io { path: self.tmp.target.clone(), cause: source };
        self.out.inner.flush().map_err(io)?;
        // The file ends with the last tensor in the layout (offsets grow with it), padded to the alignment.
        if let Some(last) = self.layout.len().checked_sub(1) {
            let end = (self.data_start + self.offsets[last] + self.sizes[last]).next_multiple_of(self.alignment);
            self.out.inner.get_ref().set_len(end).map_err(io)?;
        }
        self.tmp.commit()
    }
}

/// A temporary file beside `target` (same folder, so the final rename is atomic), removed on drop unless
/// [`commit`](Self::commit)ted.
struct TempFile {
    target: PathBuf,
    path: PathBuf,
    file: File,
    committed: bool,
}

impl TempFile {
    fn create(target: &Path) -> Result<TempFile, GgufError> {
        let mut name = target.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".tmp.{}", std::process::id()));
        let path = target.with_file_name(name);
        let file = File::create(&path).map_err(|source| GgufError::Io { path: target.to_path_buf(), cause: source })?;
        Ok(TempFile { target: target.to_path_buf(), path, file, committed: false })
    }

    /// Fsyncs the file and renames it to the target.
    fn commit(&mut self) -> Result<(), GgufError> {
        let io = |source| GgufError::Io { path: self.target.clone(), cause: source };
        self.file.sync_all().map_err(io)?;
        std::fs::rename(&self.path, &self.target).map_err(io)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The file's data alignment from `general.alignment` (default 32).
fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetaValue::U32(a)) if a.is_power_of_two() && (*a as u64) <= MAX_ALIGNMENT => Ok(*a as u64),
        Some(v) => Err(GgufError::Write { what: format!("general.alignment must be a u32 power of two, got {v:?}") }),
    }
}

/// Checks a tensor entry (name length, dimensions, a name not among `earlier`) and returns its data size.
fn check_tensor<'a>(
    mut earlier: impl Iterator<Item = &'a str>,
    name: &str,
    dims: &[u64],
    ty: GgmlType,
) -> Result<u64, GgufError> {
    if name.is_empty() || name.len() > 64 {
        return Err(GgufError::Write { what: format!("tensor name '{name}' must be 1 to 64 bytes") });
    }
    if dims.is_empty() || dims.len() > 4 {
        return Err(GgufError::Write { what: format!("tensor '{name}' must have 1 to 4 dimensions") });
    }
    if earlier.any(|n| n == name) {
        return Err(GgufError::Write { what: format!("duplicate tensor name '{name}'") });
    }
    Ok(tensor_extent(name, dims, ty)?.1)
}

/// Writes everything before the tensor data (header, metadata, tensor records, padding) and returns each tensor's
/// offset from the start of the data section.
fn write_header<W: Write>(
    w: &mut CountingWriter<W>,
    metadata: &Metadata,
    tensors: &[TensorLayout],
    sizes: &[u64],
    alignment: u64,
) -> io::Result<Vec<u64>> {
    w.put(&GGUF_MAGIC)?;
    w.put(&3u32.to_le_bytes())?;
    w.put(&(tensors.len() as u64).to_le_bytes())?;
    w.put(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata.iter() {
        put_str(w, key)?;
        w.put(&(value.meta_type() as u32).to_le_bytes())?;
        put_value(w, value)?;
    }
    let mut offset = 0u64;
    let mut offsets = Vec::with_capacity(tensors.len());
    for (t, &size) in tensors.iter().zip(sizes) {
        put_str(w, &t.name)?;
        w.put(&(t.dims.len() as u32).to_le_bytes())?;
        for d in &t.dims {
            w.put(&d.to_le_bytes())?;
        }
        w.put(&t.ty.id().to_le_bytes())?;
        w.put(&offset.to_le_bytes())?;
        offsets.push(offset);
        offset = (offset + size).next_multiple_of(alignment);
    }
    w.pad_to(alignment)?;
    Ok(offsets)
}

struct CountingWriter<W: Write> {
    inner: W,
    written: u64,
}

impl<W: Write> CountingWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        self.pad_to_absolute(self.written.next_multiple_of(alignment))
    }

    fn pad_to_absolute(&mut self, target: u64) -> io::Result<()> {
        const ZEROS: [u8; 256] = [0; 256];
        while self.written < target {
            let n = ((target - self.written) as usize).min(ZEROS.len());
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }
}

fn put_str<W: Write>(w: &mut CountingWriter<W>, s: &str) -> io::Result<()> {
    w.put(&(s.len() as u64).to_le_bytes())?;
    w.put(s.as_bytes())
}

fn put_value<W: Write>(w: &mut CountingWriter<W>, value: &MetaValue) -> io::Result<()> {
    match value {
        MetaValue::U8(v) => w.put(&[*v]),
        MetaValue::I8(v) => w.put(&v.to_le_bytes()),
        MetaValue::U16(v) => w.put(&v.to_le_bytes()),
        MetaValue::I16(v) => w.put(&v.to_le_bytes()),
        MetaValue::U32(v) => w.put(&v.to_le_bytes()),
        MetaValue::I32(v) => w.put(&v.to_le_bytes()),
        MetaValue::F32(v) => w.put(&v.to_le_bytes()),
        MetaValue::Bool(v) => w.put(&[*v as u8]),
        MetaValue::String(s) => put_str(w, s),
        MetaValue::U64(v) => w.put(&v.to_le_bytes()),
        MetaValue::I64(v) => w.put(&v.to_le_bytes()),
        MetaValue::F64(v) => w.put(&v.to_le_bytes()),
        MetaValue::Array(a) => {
            w.put(&(a.elem_type() as u32).to_le_bytes())?;
            w.put(&(a.len() as u64).to_le_bytes())?;
            macro_rules! each {
                ($v:expr) => {{
                    for x in $v {
                        w.put(&x.to_le_bytes())?;
                    }
                    Ok(())
                }};
            }
            match a {
                MetaArray::U8(v) => w.put(v),
                MetaArray::I8(v) => each!(v),
                MetaArray::U16(v) => each!(v),
                MetaArray::I16(v) => each!(v),
                MetaArray::U32(v) => each!(v),
                MetaArray::I32(v) => each!(v),
                MetaArray::F32(v) => each!(v),
                MetaArray::U64(v) => each!(v),
                MetaArray::I64(v) => each!(v),
                MetaArray::F64(v) => each!(v),
                MetaArray::Bool(v) => {
                    for b in v {
                        w.put(&[*b as u8])?;
                    }
                    Ok(())
                }
                MetaArray::String(v) => {
                    for s in v.iter() {
                        put_str(w, s)?;
                    }
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors written in parts and out of order come out as the in-memory writer lays them out, padding included.
    #[test]
    fn removing_a_key_keeps_the_others_in_order_and_findable() {
        let mut w = GgufWriter::new();
        w.set_u32("a", 1).set_u32("b", 2).set_u32("c", 3).remove("b").remove("b");
        let md = w.metadata();
        let keys: Vec<&str> = md.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!(md.get_u32("c").ok(), Some(3));
        w.set_u32("c", 4);
        assert_eq!(w.metadata().get_u32("c").ok(), Some(4));
        assert_eq!(w.metadata().len(), 2);
    }

    #[test]
    fn parts_out_of_order_give_the_in_memory_writers_bytes() {
        let shapes: [(&str, u64); 3] = [("a", 5), ("b", 12), ("c", 3)];
        let values = |n: u64, k: u64| (0..n).map(|i| (i * 7 + k) as f32 - 4.5).collect::<Vec<f32>>();
        let mut whole = GgufWriter::new();
        whole.set_str("general.architecture", "test");
        for (k, &(name, n)) in shapes.iter().enumerate() {
            whole.add_f32(name, &[n], &values(n, k as u64)).unwrap();
        }
        let want = whole.to_bytes().unwrap();

        let dir = std::env::temp_dir().join(format!("infer-write-at-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.gguf");
        let layout = shapes
            .iter()
            .map(|&(name, n)| TensorLayout { name: name.into(), dims: vec![n], ty: GgmlType::F32 })
            .collect();
        let mut w = GgufStreamWriter::create(&path, whole.metadata(), layout).unwrap();
        let bytes =
            |k: usize| -> Vec<u8> { values(shapes[k].1, k as u64).iter().flat_map(|v| v.to_le_bytes()).collect() };
        // The last tensor first, the middle one in two parts (the second part before the first).
        w.write_at(2, 0, &bytes(2)).unwrap();
        w.write_at(1, 20, &bytes(1)[20..]).unwrap();
        w.sync_data().unwrap();
        w.write_at(1, 0, &bytes(1)[..20]).unwrap();
        assert!(w.write_at(1, 0, &bytes(1)[..4]).is_err(), "a tensor's bytes are counted");
        w.write_at(0, 0, &bytes(0)).unwrap();
        w.finish().unwrap();
        let got = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn a_tensor_left_out_fails_and_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("infer-write-at-missing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.gguf");
        let layout = vec![
            TensorLayout { name: "a".into(), dims: vec![4], ty: GgmlType::F32 },
            TensorLayout { name: "b".into(), dims: vec![4], ty: GgmlType::F32 },
        ];
        let mut w = GgufStreamWriter::create(&path, &Metadata::default(), layout).unwrap();
        w.write_at(1, 0, &[0; 16]).unwrap();
        assert!(w.finish().is_err());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
}
