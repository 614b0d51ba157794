//! Dequantization of the real models' tensors against gguf-py's: `tensor-golden.json` holds, for five tensors per
//! file, the first 64 dequantized values and the sum and sum of squares of all of them. Between the two files this
//! covers Q8_0, Q4_1, Q5_0 and Q6_K block layouts on real data. (The tensor bytes' sha256 is checked first, so a
//! different download fails clearly rather than as a numeric mismatch.)

use infer::gguf::GgufFile;
use infer::kernels::dequantize;

use crate::common::{gguf_py, real_model, reference_text, sha256_hex};

#[test]
fn real_tensors_dequantize_like_gguf_py() {
    let Some(golden) = reference_text("tensor-golden.json") else { return };
    let golden: serde_json::Value = serde_json::from_str(&golden).expect("tensor-golden.json parses");
    for (model, file_name) in [("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3", "gemma-3-270m-q4_k_m.gguf")] {
        let Some(path) = real_model(model) else { continue };
        let file = GgufFile::open(&path).expect("open model");
        let tensors = golden["files"][file_name]["tensors"].as_object().expect("golden tensors");
        let mut checked = 0;
        for (name, g) in tensors {
            let Some(head) = g.get("dequant_head").and_then(|h| h.as_array()) else { continue };
            let info = file.tensor(name).expect("tensor present");
            let data = file.tensor_data(info);
            let sha = sha256_hex(data);
            assert_eq!(
                Some(sha.as_str()),
                g["sha256"].as_str(),
                "{file_name}: {name} bytes differ from the golden file"
            );
            let mut x = vec![0.0f32; info.n_elements as usize];
            dequantize(info.ty, data, &mut x).expect("dequantize");
            for (i, (want, &got)) in head.iter().zip(&x).enumerate() {
                let want = want.as_f64().expect("number");
                // gguf-py computes in f32 too, possibly in another order: allow an ulp or two.
                assert!(
                    (got as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{name}[{i}] ({}): {got} vs {want}",
                    info.ty
                );
            }
            let sum: f64 = x.iter().map(|&v| v as f64).sum();
            let sumsq: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let (want_sum, want_sumsq) = (g["dequant_sum"].as_f64().unwrap(), g["dequant_sumsq"].as_f64().unwrap());
            // Sums of ~10^5..10^7 terms in a different order: relative 1e-8 of the sum of magnitudes is plenty.
            let scale: f64 = x.iter().map(|&v| (v as f64).abs()).sum();
            assert!((sum - want_sum).abs() <= 1e-8 * scale, "{name} ({}): sum {sum} vs {want_sum}", info.ty);
            assert!((sumsq - want_sumsq).abs() <= 1e-8 * sumsq, "{name} ({}): sumsq {sumsq} vs {want_sumsq}", info.ty);
            checked += 1;
        }
        assert_eq!(checked, 5, "{file_name}: expected five tensors with dequant_head");
    }
}

/// The golden file has no Q4_K tensor, so Q4_K (27 of Gemma 3's tensors) is checked against gguf-py directly when it
/// is installed (CI installs it): the first 64 values, the sum and the sum of squares of a whole tensor.
#[test]
fn q4_k_dequantizes_like_gguf_py() {
    let Some(path) = real_model("gemma3") else { return };
    let name = "blk.0.attn_output.weight";
    let script = r#"
import sys, json
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
t = [t for t in r.tensors if t.name == sys.argv[2]][0]
x = dequantize(t.data, t.tensor_type).astype("float64").ravel()
print(json.dumps({"type": t.tensor_type.name, "head": x[:64].tolist(), "sum": float(x.sum()), "sumsq": float((x * x).sum())}))
"#;
    let Some(text) = gguf_py(script, &[path.as_os_str(), name.as_ref()]) else { return };
    let want: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(want["type"], "Q4_K");
    let file = GgufFile::open(&path).unwrap();
    let info = file.tensor(name).unwrap();
    let mut x = vec![0.0f32; info.n_elements as usize];
    dequantize(info.ty, file.tensor_data(info), &mut x).unwrap();
    for (w, &g) in want["head"].as_array().unwrap().iter().zip(&x) {
        let w = w.as_f64().unwrap();
        assert!((w - g as f64).abs() <= 1e-6 * w.abs().max(1e-3), "{name}: {g} vs gguf-py {w}");
    }
    let sum: f64 = x.iter().map(|&v| v as f64).sum();
    let sumsq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let (ws, wq) = (want["sum"].as_f64().unwrap(), want["sumsq"].as_f64().unwrap());
    assert!((sum - ws).abs() <= 1e-6 * wq.sqrt().max(1.0) * 10.0, "sum {sum} vs {ws}");
    assert!((sumsq - wq).abs() <= 1e-6 * wq, "sumsq {sumsq} vs {wq}");
}
