//! The GGUF reader and writer: round trips, hostile files, `infer info`.

use infer::gguf::{GgufError, GgufFile, GgufWriter, MetaArray, MetaValue, StrList};
use infer::kernels::GgmlType;

use crate::common::{assert_clean_failure, infer, real_model, tempdir};

/// A small file exercising every metadata type, arrays of strings, and tensors of several types.
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama")
        .set_str("general.name", "tiny \u{1F980} test")
        .set_u32("llama.block_count", 2)
        .set_f32("llama.rope.freq_base", 10000.0)
        .set_bool("tokenizer.ggml.add_bos_token", true)
        .set("t.u8", MetaValue::U8(7))
        .set("t.i8", MetaValue::I8(-7))
        .set("t.u16", MetaValue::U16(65535))
        .set("t.i16", MetaValue::I16(-300))
        .set("t.i32", MetaValue::I32(-70000))
        .set("t.u64", MetaValue::U64(1 << 40))
        .set("t.i64", MetaValue::I64(-(1 << 40)))
        .set("t.f64", MetaValue::F64(0.125))
        .set("t.strings", MetaValue::Array(MetaArray::String(StrList::from_iter(["a", "", "<|im_end|>"]))))
        .set("t.f32s", MetaValue::Array(MetaArray::F32(vec![1.0, -2.5, 3.25])))
        .set("t.bools", MetaValue::Array(MetaArray::Bool(vec![true, false])))
        .set("t.empty", MetaValue::Array(MetaArray::I32(vec![])));
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
    w.add_f32("a.weight", &[16, 4], &values).unwrap();
    w.add_tensor("b.weight", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]).unwrap();
    w.add_f32("c.bias", &[3], &[1.0, 2.0, 3.0]).unwrap();
    w
}

#[test]
fn write_then_read_round_trips() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata(), w.metadata());
    assert_eq!(f.tensors().len(), 3);
    let a = f.tensor("a.weight").unwrap();
    assert_eq!((a.dims.clone(), a.ty, a.n_bytes), (vec![16, 4], GgmlType::F32, 256));
    let back: Vec<f32> = f.tensor_data(a).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(back[5], 5.0 * 0.5 - 3.0);
    assert_eq!(f.tensor_data(f.tensor("b.weight").unwrap()), &[1u8; 68][..]);
    for t in f.tensors() {
        assert_eq!((f.data_offset() + t.offset) % 32, 0, "tensor data is aligned");
    }
    // Writing what we read gives the same bytes again.
    let mut again = GgufWriter::new();
    again.copy_metadata(f.metadata());
    for t in f.tensors() {
        again.add_tensor(&t.name, &t.dims, t.ty, f.tensor_data(t).to_vec()).unwrap();
    }
    assert_eq!(again.to_bytes().unwrap(), bytes);
}

#[test]
fn alignment_is_honoured() {
    let mut w = sample_writer();
    w.set_u32("general.alignment", 64);
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    for t in f.tensors() {
        assert_eq!((f.data_offset() + t.offset) % 64, 0);
    }
}

#[test]
fn atomic_write_to_disk() {
    let dir = tempdir();
    let path = dir.path().join("m.gguf");
    sample_writer().write_file(&path).unwrap();
    assert!(GgufFile::open(&path).is_ok());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left behind");
}

#[test]
fn gguf_py_reads_our_files() {
    let dir = tempdir();
    let path = dir.path().join("m.gguf");
    sample_writer().write_file(&path).unwrap();
    let script = r#"
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
names = sorted(t.name for t in r.tensors)
assert names == ["a.weight", "b.weight", "c.bias"], names
arch = r.fields["general.architecture"]
assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
strs = r.fields["t.strings"]
assert [bytes(strs.parts[i]).decode() for i in strs.data] == ["a", "", "<|im_end|>"]
a = [t for t in r.tensors if t.name == "a.weight"][0]
assert list(a.shape) == [16, 4], a.shape
assert abs(float(a.data.flatten()[5]) - (5 * 0.5 - 3.0)) < 1e-6
print("OK")
"#;
    let Some(stdout) = crate::common::gguf_py(script, &[path.as_os_str()]) else { return };
    assert!(stdout.contains("OK"), "{stdout}");
}

fn parse_err(bytes: Vec<u8>) -> GgufError {
    GgufFile::from_bytes(bytes).expect_err("must be rejected")
}

#[test]
fn truncated_files_are_rejected_at_every_length() {
    let bytes = sample_writer().to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_end = f.tensors().iter().map(|t| f.data_offset() + t.offset + t.n_bytes).max().unwrap() as usize;
    // Every prefix that cuts into the header or the data must fail cleanly (no panic). Trailing padding after the
    // last tensor is optional, so prefixes that only drop it stay valid.
    for len in 0..data_end {
        let err = parse_err(bytes[..len].to_vec());
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                GgufError::UnexpectedEof { .. } | GgufError::TensorOutOfBounds { .. } | GgufError::CountTooLarge { .. }
            ),
            "prefix {len}: {msg}"
        );
    }
}

#[test]
fn bad_magic_version_and_counts() {
    let good = sample_writer().to_bytes().unwrap();
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGUG");
    assert!(matches!(parse_err(b), GgufError::BadMagic { .. }));
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = parse_err(b);
        assert!(matches!(e, GgufError::UnsupportedVersion { .. } | GgufError::WrongEndianness { .. }), "{e}");
    }
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse_err(b), GgufError::CountTooLarge { field: "n_tensors", .. }));
    let mut b = good;
    b[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(parse_err(b), GgufError::CountTooLarge { field: "n_kv", .. }));
}

/// Builds a file by hand: header, one key-value pair given as raw bytes, one tensor record.
fn handcrafted(kv: &[u8], tensor: &[u8], data_len: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((if tensor.is_empty() { 0u64 } else { 1 }).to_le_bytes());
    b.extend((if kv.is_empty() { 0u64 } else { 1 }).to_le_bytes());
    b.extend(kv);
    b.extend(tensor);
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(vec![0u8; data_len]);
    b
}

fn kv(key: &str, type_id: u32, value: &[u8]) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend(key.as_bytes());
    b.extend(type_id.to_le_bytes());
    b.extend(value);
    b
}

fn tensor_record(name: &str, dims: &[u64], type_id: u32, offset: u64) -> Vec<u8> {
    let mut b = (name.len() as u64).to_le_bytes().to_vec();
    b.extend(name.as_bytes());
    b.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend(d.to_le_bytes());
    }
    b.extend(type_id.to_le_bytes());
    b.extend(offset.to_le_bytes());
    b
}

#[test]
fn hostile_metadata_is_rejected_by_name() {
    assert!(matches!(parse_err(handcrafted(&kv("", 4, &[0; 4]), &[], 0)), GgufError::EmptyKey { .. }));
    assert!(matches!(
        parse_err(handcrafted(&kv("k", 13, &[0; 4]), &[], 0)),
        GgufError::UnknownValueType { type_id: 13, .. }
    ));
    assert!(matches!(parse_err(handcrafted(&kv("k", 7, &[2]), &[], 0)), GgufError::InvalidBool { byte: 2, .. }));
    // A string claiming more bytes than the file has.
    assert!(matches!(
        parse_err(handcrafted(&kv("k", 8, &u64::MAX.to_le_bytes()), &[], 0)),
        GgufError::StringTooLong { .. }
    ));
    let mut huge_string = (1000u64).to_le_bytes().to_vec();
    huge_string.extend(b"short");
    assert!(matches!(parse_err(handcrafted(&kv("k", 8, &huge_string), &[], 0)), GgufError::UnexpectedEof { .. }));
    // An array of 2^62 u32s, and a nested array.
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend((1u64 << 62).to_le_bytes());
    assert!(matches!(parse_err(handcrafted(&kv("k", 9, &arr), &[], 0)), GgufError::CountTooLarge { .. }));
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend(1u64.to_le_bytes());
    assert!(matches!(parse_err(handcrafted(&kv("k", 9, &nested), &[], 0)), GgufError::NestedArray { .. }));
    // general.alignment: zero, not a power of two, and the wrong type.
    for a in [0u32, 13, 1 << 30] {
        let e = parse_err(handcrafted(&kv("general.alignment", 4, &a.to_le_bytes()), &[], 0));
        assert!(matches!(e, GgufError::InvalidAlignment { .. }), "{e}");
    }
    let e = parse_err(handcrafted(&kv("general.alignment", 5, &32i32.to_le_bytes()), &[], 0));
    assert!(matches!(e, GgufError::TypeMismatch { .. }), "{e}");
    // Duplicate keys.
    let mut two = kv("k", 4, &[0; 4]);
    two.extend(kv("k", 4, &[1; 4]));
    let mut b = handcrafted(&two, &[], 0);
    b[16..24].copy_from_slice(&2u64.to_le_bytes());
    assert!(matches!(parse_err(b), GgufError::DuplicateKey { .. }));
}

#[test]
fn hostile_tensor_records_are_rejected_by_name() {
    let ok = handcrafted(&[], &tensor_record("t", &[32, 2], 0, 0), 256);
    assert!(GgufFile::from_bytes(ok).is_ok());
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (handcrafted(&[], &tensor_record("t", &[32, 2], 0, 0), 255), "outside the file"),
        (handcrafted(&[], &tensor_record("t", &[32, 2], 0, u64::MAX - 31), 256), "outside the file"),
        (handcrafted(&[], &tensor_record("t", &[32, 2], 0, 8), 256), "not a multiple of the alignment"),
        (handcrafted(&[], &tensor_record("t", &[1, 1, 1, 1, 1], 0, 0), 256), "dimensions"),
        (handcrafted(&[], &tensor_record("t", &[u64::MAX], 0, 0), 256), "dimension 0"),
        (handcrafted(&[], &tensor_record("t", &[1 << 40, 1 << 40], 0, 0), 256), "overflows"),
        (handcrafted(&[], &tensor_record("t", &[32], 4, 0), 256), "removed"),
        (handcrafted(&[], &tensor_record("t", &[32], 99, 0), 256), "unknown ggml type id 99"),
        (handcrafted(&[], &tensor_record("t", &[33], 2, 0), 256), "block size"),
        (handcrafted(&[], &tensor_record(&"x".repeat(65), &[32], 0, 0), 256), "longer than"),
    ];
    for (bytes, needle) in cases {
        let e = parse_err(bytes).to_string();
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }
    // Two tensors sharing bytes.
    let mut recs = tensor_record("a", &[32], 0, 0);
    recs.extend(tensor_record("b", &[32], 0, 64));
    let mut b = handcrafted(&[], &recs, 256);
    b[8..16].copy_from_slice(&2u64.to_le_bytes());
    // Re-pad: the second record shifted the data section; rebuild by hand so offsets stay meaningful.
    assert!(matches!(parse_err(b), GgufError::OverlappingTensors { .. } | GgufError::TensorOutOfBounds { .. }));
    // A zero-sized tensor is fine.
    assert!(GgufFile::from_bytes(handcrafted(&[], &tensor_record("z", &[0, 4], 0, 0), 0)).is_ok());
}

#[test]
fn unsupported_types_are_named() {
    let e = GgufError::UnsupportedType { name: "blk.0.ffn_down.weight".into(), ty: GgmlType::Q3_K };
    assert_eq!(e.to_string(), "tensor 'blk.0.ffn_down.weight': type Q3_K (11) is not supported yet");
}

#[test]
fn cli_errors_are_one_line_and_nonzero() {
    let dir = tempdir();
    let truncated = dir.path().join("truncated.gguf");
    let bytes = sample_writer().to_bytes().unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 25]).unwrap();
    assert_clean_failure(&infer(&["info", truncated.to_str().unwrap()]), "outside the file");

    let magic = dir.path().join("magic.gguf");
    std::fs::write(&magic, b"GGML\x03\0\0\0garbage").unwrap();
    assert_clean_failure(&infer(&["info", magic.to_str().unwrap()]), "not a GGUF file");

    let past_end = dir.path().join("past_end.gguf");
    std::fs::write(&past_end, handcrafted(&[], &tensor_record("t", &[32, 2], 0, 4096), 256)).unwrap();
    assert_clean_failure(&infer(&["info", past_end.to_str().unwrap()]), "outside the file");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_clean_failure(&infer(&["info", empty.to_str().unwrap()]), "truncated");

    assert_clean_failure(&infer(&["info", dir.path().to_str().unwrap()]), "is a directory");
    assert_clean_failure(&infer(&["info", dir.path().join("missing.gguf").to_str().unwrap()]), "No such file");
}

/// An I/O error reading a model names the file and its cause once: the cause used to be both in `GgufError::Io`'s
/// message and its source, so the CLI's `{:#}` printed "...: Input/output error (os error 5): Input/output error
/// (os error 5)".
#[cfg(target_os = "linux")]
#[test]
fn an_io_error_prints_its_cause_once() {
    // /proc/self/mem exists and opens, but reading it from offset 0 fails with EIO.
    let e = GgufFile::read("/proc/self/mem").unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e:?}");
    let out = infer(&["run", "/proc/self/mem", "--no-mmap", "-p", "x"]);
    assert_clean_failure(&out, "/proc/self/mem: Input/output error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("Input/output error").count(), 1, "{err}");
}

#[test]
fn info_on_real_models() {
    for (name, arch, n_tensors) in [("smollm2", "llama", 272), ("gemma3", "gemma3", 236)] {
        let Some(path) = real_model(name) else { continue };
        let out = infer(&["info", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("architecture:  {arch}")), "{text}");
        assert!(text.contains(&format!("tensors:       {n_tensors}")), "{text}");

        let out = infer(&["info", "--json", path.to_str().unwrap()]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json parses");
        assert_eq!(v["architecture"], arch);
        assert!(v["metadata"].is_object());
        let tensors = v["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), n_tensors);
        for key in ["name", "type", "shape", "offset", "bytes"] {
            assert!(tensors[0].get(key).is_some(), "tensor records carry {key}");
        }
    }
}

#[test]
fn info_pipes_into_head_quietly() {
    let Some(path) = real_model("smollm2") else { return };
    let mut child = crate::common::infer_bin()
        .args(["info", "--full", path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read one line and hang up, like `| head -1`.
    {
        use std::io::BufRead;
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "broken pipe exits 0: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "and quietly: {}", String::from_utf8_lossy(&out.stderr));
}
