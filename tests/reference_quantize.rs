//! Byte-exact agreement with llama.cpp's quantizers and dequantizers on a real model.
//!
//! `tensor-golden.json` (see `../shared/reference/README.md`) records the sha256 of every tensor of
//! `smollm2-135m-instruct.requant-F32.gguf` (llama.cpp's dequantization of the shipped SmolLM2 Q4_1 file) and of
//! `smollm2-pure-{Q8_0,Q4_0,Q4_1,Q2_K}.gguf` (`llama-quantize --pure` of that F32 file). We rebuild both from the
//! shipped file: dequantize every tensor with `infer_kernels::dequantize`, then quantize the result with the
//! `quantize_row_ref` of whatever type llama.cpp chose for that tensor (Q2_K falls back to Q4_0 on rows that are
//! not a multiple of 256; 1-D norms stay F32), and compare hashes. Equal hashes mean our Q4_1/Q8_0 dequantizers
//! and our Q8_0/Q4_0/Q4_1/Q2_K reference quantizers produce llama.cpp's exact bytes.

use infer::gguf::GgufFile;
use infer::kernels::quant::{blocks_as_bytes, quantize};
use infer::kernels::{GgmlType, dequantize};
use rayon::prelude::*;

use crate::common::{real_model, reference_text, sha256_hex};

/// `x` quantized to `ty` with our byte-level entry point (the `quantize_row_ref`s underneath).
fn quantize_bytes(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).expect("whole blocks") as usize];
    quantize(ty, x, &mut out).expect("quantize");
    out
}

#[test]
fn smollm2_requantization_is_byte_exact_with_llamacpp() {
    let Some(golden) = reference_text("tensor-golden.json") else { return };
    let Some(path) = real_model("smollm2") else { return };
    let golden: serde_json::Value = serde_json::from_str(&golden).expect("tensor-golden.json parses");
    let files = &golden["files"];
    let file = GgufFile::open(&path).expect("open SmolLM2");

    let f32_name = "smollm2-135m-instruct.requant-F32.gguf";
    let pure = ["Q8_0", "Q4_0", "Q4_1", "Q2_K"].map(|t| (t, format!("smollm2-pure-{t}.gguf")));
    assert_eq!(files[f32_name]["n_tensors"].as_u64(), Some(file.tensors().len() as u64));

    // One entry per (tensor, target) that disagrees; empty means byte-exact everywhere.
    let mismatches: Vec<String> = file
        .tensors()
        .par_iter()
        .flat_map_iter(|info| {
            let mut bad = Vec::new();
            let mut x = vec![0.0f32; info.n_elements as usize];
            dequantize(info.ty, file.tensor_data(info), &mut x).expect("dequantize");
            let want = files[f32_name]["tensors"][&info.name]["sha256"].as_str().unwrap_or("<missing>");
            if sha256_hex(blocks_as_bytes(&x[..])) != want {
                bad.push(format!("{}: dequantized {} differs from llama.cpp's F32", info.name, info.ty));
            }
            for (label, golden_file) in &pure {
                let g = &files[golden_file.as_str()]["tensors"][&info.name];
                let ty = g["type"].as_str().and_then(GgmlType::from_name).expect("golden type");
                if sha256_hex(&quantize_bytes(ty, &x)) != g["sha256"].as_str().unwrap_or("<missing>") {
                    bad.push(format!("{}: {ty} (in the pure {label} file) differs from llama.cpp's", info.name));
                }
            }
            bad
        })
        .collect();
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
}
