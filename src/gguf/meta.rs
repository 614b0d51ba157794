//! GGUF metadata: typed values, and accessors whose errors name the key.
//!
//! Integers are accepted in any width that holds the value (writers disagree on whether `context_length` is a u32
//! or a u64), floats as f32 or f64. Strings are stored as read; invalid UTF-8 is only an error where a key's
//! meaning needs text.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use super::error::GgufError;
use super::strlist::StrList;

/// The value type ids of GGUF metadata (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaType {
    pub fn from_id(id: u32) -> Option<MetaType> {
        use MetaType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one element of this type in the file (strings: the minimum, an empty string's length prefix).
    pub fn min_size(self) -> u64 {
        use MetaType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use MetaType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value, stored as a typed vector (a 262k-entry vocabulary stays compact).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    /// One text buffer plus offsets, not a `Vec<String>`: vocabularies have 10^5 entries (see [`StrList`]).
    String(StrList),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> MetaType {
        match self {
            MetaArray::U8(_) => MetaType::U8,
            MetaArray::I8(_) => MetaType::I8,
            MetaArray::U16(_) => MetaType::U16,
            MetaArray::I16(_) => MetaType::I16,
            MetaArray::U32(_) => MetaType::U32,
            MetaArray::I32(_) => MetaType::I32,
            MetaArray::F32(_) => MetaType::F32,
            MetaArray::Bool(_) => MetaType::Bool,
            MetaArray::String(_) => MetaType::String,
            MetaArray::U64(_) => MetaType::U64,
            MetaArray::I64(_) => MetaType::I64,
            MetaArray::F64(_) => MetaType::F64,
        }
    }

    /// Element `i` as an integer, if the array holds integers and the index exists.
    pub fn get_i64(&self, i: usize) -> Option<i64> {
        Some(match self {
            MetaArray::U8(v) => *v.get(i)? as i64,
            MetaArray::I8(v) => *v.get(i)? as i64,
            MetaArray::U16(v) => *v.get(i)? as i64,
            MetaArray::I16(v) => *v.get(i)? as i64,
            MetaArray::U32(v) => *v.get(i)? as i64,
            MetaArray::I32(v) => *v.get(i)? as i64,
            MetaArray::U64(v) => i64::try_from(*v.get(i)?).ok()?,
            MetaArray::I64(v) => *v.get(i)?,
            _ => return None,
        })
    }
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(_) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// A short description of the type, e.g. `u32` or `array<string>`.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::Array(a) => match a.elem_type() {
                MetaType::U8 => "array<u8>",
                MetaType::I8 => "array<i8>",
                MetaType::U16 => "array<u16>",
                MetaType::I16 => "array<i16>",
                MetaType::U32 => "array<u32>",
                MetaType::I32 => "array<i32>",
                MetaType::F32 => "array<f32>",
                MetaType::Bool => "array<bool>",
                MetaType::String => "array<string>",
                MetaType::U64 => "array<u64>",
                MetaType::I64 => "array<i64>",
                MetaType::F64 => "array<f64>",
                MetaType::Array => "array<array>",
            },
            v => v.meta_type().name(),
        }
    }

    /// The value as a signed integer, if it is an integer of any width that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v as i64),
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::U16(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::U32(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value as a float, if it is an f32 or f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A one-line rendering for reports: long arrays and strings are summarised.
    pub fn summary(&self, max_items: usize) -> String {
        fn list<T: std::fmt::Debug>(v: impl ExactSizeIterator<Item = T>, max: usize) -> String {
            let len = v.len();
            let shown: Vec<String> = v.take(max).map(|x| format!("{x:?}")).collect();
            if len > max {
                format!("[{}, ... ({} items)]", shown.join(", "), len)
            } else {
                format!("[{}]", shown.join(", "))
            }
        }
        match self {
            MetaValue::String(s) => {
                let mut out: String = s.chars().take(80).collect();
                if out.len() < s.len() {
                    out.push_str(&format!("... ({} bytes)", s.len()));
                }
                format!("{out:?}")
            }
            MetaValue::Array(a) => match a {
                MetaArray::U8(v) => list(v.iter(), max_items),
                MetaArray::I8(v) => list(v.iter(), max_items),
                MetaArray::U16(v) => list(v.iter(), max_items),
                MetaArray::I16(v) => list(v.iter(), max_items),
                MetaArray::U32(v) => list(v.iter(), max_items),
                MetaArray::I32(v) => list(v.iter(), max_items),
                MetaArray::F32(v) => list(v.iter(), max_items),
                MetaArray::Bool(v) => list(v.iter(), max_items),
                MetaArray::String(v) => list(v.iter(), max_items),
                MetaArray::U64(v) => list(v.iter(), max_items),
                MetaArray::I64(v) => list(v.iter(), max_items),
                MetaArray::F64(v) => list(v.iter(), max_items),
            },
            MetaValue::U8(v) => v.to_string(),
            MetaValue::I8(v) => v.to_string(),
            MetaValue::U16(v) => v.to_string(),
            MetaValue::I16(v) => v.to_string(),
            MetaValue::U32(v) => v.to_string(),
            MetaValue::I32(v) => v.to_string(),
            MetaValue::F32(v) => v.to_string(),
            MetaValue::Bool(v) => v.to_string(),
            MetaValue::U64(v) => v.to_string(),
            MetaValue::I64(v) => v.to_string(),
            MetaValue::F64(v) => v.to_string(),
        }
    }

    /// The value as JSON (full arrays; callers summarise if they want).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{Value, json};
        fn f(x: f64) -> Value {
            serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
        }
        match self {
            MetaValue::U8(v) => json!(v),
            MetaValue::I8(v) => json!(v),
            MetaValue::U16(v) => json!(v),
            MetaValue::I16(v) => json!(v),
            MetaValue::U32(v) => json!(v),
            MetaValue::I32(v) => json!(v),
            MetaValue::F32(v) => f(*v as f64),
            MetaValue::Bool(v) => json!(v),
            MetaValue::String(v) => json!(v),
            MetaValue::U64(v) => json!(v),
            MetaValue::I64(v) => json!(v),
            MetaValue::F64(v) => f(*v),
            MetaValue::Array(a) => match a {
                MetaArray::U8(v) => json!(v),
                MetaArray::I8(v) => json!(v),
                MetaArray::U16(v) => json!(v),
                MetaArray::I16(v) => json!(v),
                MetaArray::U32(v) => json!(v),
                MetaArray::I32(v) => json!(v),
                MetaArray::F32(v) => Value::Array(v.iter().map(|x| f(*x as f64)).collect()),
                MetaArray::Bool(v) => json!(v),
                MetaArray::String(v) => Value::Array(v.iter().map(|x| json!(x)).collect()),
                MetaArray::U64(v) => json!(v),
                MetaArray::I64(v) => json!(v),
                MetaArray::F64(v) => Value::Array(v.iter().map(|x| f(*x)).collect()),
            },
        }
    }
}

/// The key-value section of a GGUF file, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a key; returns false (and changes nothing) if the key is already present.
    pub fn insert(&mut self, key: String, value: MetaValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Removes a key (the others keep their order); returns its value if it was there.
    pub fn remove(&mut self, key: &str) -> Option<MetaValue> {
        let i = self.index.remove(key).filter(|&i| i < self.entries.len())?;
        let (_, value) = self.entries.remove(i);
        // Positions after `i` moved down by one: the index is rebuilt (removal is rare, files have few keys).
        self.index = self.entries.iter().enumerate().map(|(j, (k, _))| (k.clone(), j)).collect();
        Some(value)
    }

    /// Sets a key, replacing any earlier value in place.
    pub fn set(&mut self, key: &str, value: MetaValue) {
        match self.index.get(key) {
            Some(&i) => {
                if let Some(entry) = self.entries.get_mut(i) {
                    entry.1 = value;
                }
            }
            None => {
                self.insert(key.to_string(), value);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).and_then(|&i| self.entries.get(i)).map(|(_, v)| v)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    fn mismatch(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
        GgufError::TypeMismatch { key: key.to_string(), expected, found: found.type_name() }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::mismatch(key, "string", v))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        if self.contains(key) { self.get_str(key).map(Some) } else { Ok(None) }
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        match v.as_u64() {
            Some(x) => Ok(x),
            None if v.as_i64().is_some() => Err(GgufError::ValueOutOfRange {
                key: key.to_string(),
                value: v.summary(4),
                why: "must not be negative".into(),
            }),
            None => Err(Self::mismatch(key, "unsigned integer", v)),
        }
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        if self.contains(key) { self.get_u64(key).map(Some) } else { Ok(None) }
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let x = self.get_u64(key)?;
        u32::try_from(x).map_err(|_| GgufError::ValueOutOfRange {
            key: key.to_string(),
            value: x.to_string(),
            why: "does not fit in 32 bits".into(),
        })
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        if self.contains(key) { self.get_u32(key).map(Some) } else { Ok(None) }
    }

    /// A count or size: an unsigned integer that fits in `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let x = self.get_u64(key)?;
        usize::try_from(x).map_err(|_| GgufError::ValueOutOfRange {
            key: key.to_string(),
            value: x.to_string(),
            why: "too large".into(),
        })
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        if self.contains(key) { self.get_usize(key).map(Some) } else { Ok(None) }
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.require(key)?;
        v.as_i64().ok_or_else(|| Self::mismatch(key, "integer", v))
    }

    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        if self.contains(key) { self.get_i64(key).map(Some) } else { Ok(None) }
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| Self::mismatch(key, "float", v))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        if self.contains(key) { self.get_f32(key).map(Some) } else { Ok(None) }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        match v {
            MetaValue::Bool(b) => Ok(*b),
            _ => Err(Self::mismatch(key, "bool", v)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        if self.contains(key) { self.get_bool(key).map(Some) } else { Ok(None) }
    }

    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::mismatch(key, "array", v))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&MetaArray>, GgufError> {
        if self.contains(key) { self.get_array(key).map(Some) } else { Ok(None) }
    }

    pub fn get_string_array(&self, key: &str) -> Result<&StrList, GgufError> {
        match self.get_array(key)? {
            MetaArray::String(v) => Ok(v),
            _ => Err(Self::mismatch(key, "array<string>", self.require(key)?)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.get_array(key)? {
            MetaArray::F32(v) => Ok(v),
            _ => Err(Self::mismatch(key, "array<f32>", self.require(key)?)),
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.get_array(key)? {
            MetaArray::I32(v) => Ok(v),
            _ => Err(Self::mismatch(key, "array<i32>", self.require(key)?)),
        }
    }

    /// The architecture name (`general.architecture`), which prefixes the model's hyper-parameter keys.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }
}
