//! The GGUF reader on raw bytes: any input is parsed, or refused with an error, without a panic, a read outside
//! the input, or memory beyond a small multiple of it. What parses is then walked the way `infer info` does.
#![no_main]

use infer::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else { return };
    for (key, value) in file.metadata().iter() {
        let _ = (key.len(), value.type_name(), value.summary(8), value.to_json());
    }
    let md = file.metadata();
    let _ = (md.architecture(), md.opt_u64("general.alignment"), md.opt_str("general.name"));
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes, "tensor '{}' data", t.name);
        assert!(file.tensor_info(&t.name).is_some());
    }
    let _ = (file.parameter_count(), file.tensor_bytes_total());
});
