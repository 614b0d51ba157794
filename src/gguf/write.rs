//! Writing GGUF v3 files that llama.cpp and gguf-py read: used by `infer quantize` and by the tests, which build
//! tiny synthetic models with it.
//!
//! Files are written atomically: to a temporary file beside the target, flushed and fsynced, then renamed, so a
//! failed or interrupted write never leaves a half-written model under the real name.

use std::io::{self, Write};
use std::path::Path;

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
        if name.is_empty() || name.len() > 64 {
            return Err(GgufError::Write { what: format!("tensor name '{name}' must be 1 to 64 bytes") });
        }
        if dims.is_empty() || dims.len() > 4 {
            return Err(GgufError::Write { what: format!("tensor '{name}' must have 1 to 4 dimensions") });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Write { what: format!("duplicate tensor name '{name}'") });
        }
        let (_, n_bytes) = tensor_extent(name, dims, ty)?;
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

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(MetaValue::U32(a)) if a.is_power_of_two() && (*a as u64) <= MAX_ALIGNMENT => Ok(*a as u64),
            Some(v) => {
                Err(GgufError::Write { what: format!("general.alignment must be a u32 power of two, got {v:?}") })
            }
        }
    }

    /// Serialises the file.
    pub fn write_to(&self, out: &mut impl Write) -> Result<(), GgufError> {
        let alignment = self.alignment()?;
        let io = |e: io::Error| GgufError::Write { what: e.to_string() };
        let mut w = CountingWriter { inner: out, written: 0 };
        w.put(&GGUF_MAGIC).map_err(io)?;
        w.put(&3u32.to_le_bytes()).map_err(io)?;
        w.put(&(self.tensors.len() as u64).to_le_bytes()).map_err(io)?;
        w.put(&(self.metadata.len() as u64).to_le_bytes()).map_err(io)?;
        for (key, value) in self.metadata.iter() {
            put_str(&mut w, key).map_err(io)?;
            w.put(&(value.meta_type() as u32).to_le_bytes()).map_err(io)?;
            put_value(&mut w, value).map_err(io)?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut w, &t.name).map_err(io)?;
            w.put(&(t.dims.len() as u32).to_le_bytes()).map_err(io)?;
            for d in &t.dims {
                w.put(&d.to_le_bytes()).map_err(io)?;
            }
            w.put(&t.ty.id().to_le_bytes()).map_err(io)?;
            w.put(&offset.to_le_bytes()).map_err(io)?;
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        w.pad_to(alignment).map_err(io)?;
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
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), source };
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(io)?;
            let mut buffered = io::BufWriter::new(file);
            self.write_to(&mut buffered)?;
            let file = buffered.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> CountingWriter<'_, W> {
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
                    for s in v {
                        put_str(w, s)?;
                    }
                    Ok(())
                }
            }
        }
    }
}
