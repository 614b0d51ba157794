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
use infer::kernels::quant::{self, BlockQ2K, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK_K, blocks_as_bytes};
use infer::kernels::{GgmlType, dequantize};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::common::{real_model, reference};

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `x` quantized to `ty` with our reference quantizer, as raw GGUF bytes.
fn quantize_bytes(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    fn run<B: quant::Block>(x: &[f32], qk: usize, zero: B, q: fn(&[f32], &mut [B])) -> Vec<u8> {
        let mut blocks = vec![zero; x.len() / qk];
        q(x, &mut blocks);
        blocks_as_bytes(&blocks).to_vec()
    }
    match ty {
        GgmlType::F32 => blocks_as_bytes(x).to_vec(),
        GgmlType::Q8_0 => run(x, 32, BlockQ8_0::default(), quant::q8_0::quantize_row_ref),
        GgmlType::Q4_0 => run(x, 32, BlockQ4_0::default(), quant::q4_0::quantize_row_ref),
        GgmlType::Q4_1 => run(x, 32, BlockQ4_1::default(), quant::q4_1::quantize_row_ref),
        GgmlType::Q2_K => {
            let zero = BlockQ2K { scales: [0; 16], qs: [0; QK_K / 4], d: half::f16::ZERO, dmin: half::f16::ZERO };
            run(x, QK_K, zero, quant::q2_k::quantize_row_ref)
        }
        other => panic!("the golden files hold no {other} tensors"),
    }
}

#[test]
fn smollm2_requantization_is_byte_exact_with_llamacpp() {
    let golden_path = reference("tensor-golden.json");
    let Ok(golden) = std::fs::read_to_string(&golden_path) else {
        eprintln!("note: skipping, {} not found", golden_path.display());
        return;
    };
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
