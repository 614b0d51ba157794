#!/usr/bin/env python3
"""Write a llama-shaped GGUF of random Q4_1 weights, large enough that decode reads its weights from DRAM.

The registry's models are small (SmolLM2 Q4_1 is 94 MiB), so on a CPU with a large L3 (a Xeon guest here reports
480 MB) their weights stay in the cache from token to token, and decode never shows how a kernel streams from
memory, which is what users with 1-8 B models see. This file keeps SmolLM2's tokenizer (so `infer` and llama.cpp
both load it and tokenize alike) and gives it a larger body of random weights:

    scripts/make-dram-model.py SMOLLM2.gguf OUT.gguf [--layers 60]

60 layers of width 2048 (FFN 8192, 32 query and 8 KV heads of 64) make 3.75 B parameters, 2.2 GiB. Other types
come from it with `llama-quantize --allow-requantize OUT.gguf OTHER.gguf Q4_0` (or Q8_0, Q4_K_M). The weights are
random, so the text is noise: the file is for speed, never for quality.

Needs gguf-py (`pip install gguf`), which brings numpy.
"""

import argparse

import gguf
import numpy as np

WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN = 2048, 32, 8, 64, 8192


def copy_tokenizer(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    """Copies every tokenizer.* key; returns the vocabulary size."""
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                values = [field.parts[i][0].item() for i in field.data]
            writer.add_array(field.name, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(field.name, bytes(field.parts[field.data[0]]).decode())
        else:
            writer.add_key_value(field.name, field.parts[field.data[0]][0].item(), kind)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def q4_1(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_1 blocks (f16 scale, f16 minimum, 16 bytes of nibbles), scaled so activations stay finite."""
    nb = cols // 32
    blocks = np.zeros((rows, nb, 20), np.uint8)
    d = (rng.uniform(0.5, 1.5, (rows, nb)) * (0.1 / np.sqrt(cols))).astype(np.float16)
    blocks[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    blocks[:, :, 2:4] = (-8 * d.astype(np.float32)).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    blocks[:, :, 4:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    return blocks.reshape(rows, nb * 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tokenizer_from", help="a GGUF whose tokenizer to keep (SmolLM2's)")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    writer = gguf.GGUFWriter(args.out, "llama")
    vocab = copy_tokenizer(gguf.GGUFReader(args.tokenizer_from), writer)
    writer.add_name(f"random llama {args.layers}x{WIDTH} (speed tests only)")
    writer.add_context_length(8192)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)

    rng = np.random.default_rng(args.seed)

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, q4_1(rng, rows, cols), raw_dtype=gguf.GGMLQuantizationType.Q4_1)

    # Tied embeddings, as SmolLM2: the output matrix is token_embd.
    matrix("token_embd.weight", vocab, WIDTH)
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    for i in range(args.layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(WIDTH, np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(WIDTH, np.float32))
        matrix(p + "attn_q.weight", HEADS * HEAD_DIM, WIDTH)
        matrix(p + "attn_k.weight", KV_HEADS * HEAD_DIM, WIDTH)
        matrix(p + "attn_v.weight", KV_HEADS * HEAD_DIM, WIDTH)
        matrix(p + "attn_output.weight", WIDTH, HEADS * HEAD_DIM)
        matrix(p + "ffn_gate.weight", FFN, WIDTH)
        matrix(p + "ffn_up.weight", FFN, WIDTH)
        matrix(p + "ffn_down.weight", WIDTH, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
