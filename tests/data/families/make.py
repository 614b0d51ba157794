#!/usr/bin/env python3
"""Builds the model-family fixtures: for each family, a tiny model with random weights from Hugging Face
`transformers`' own config and model classes, converted to GGUF by llama.cpp's convert_hf_to_gguf.py, with
transformers' f32 logits and greedy continuations recorded beside it.

Run by hand (not in CI), from anywhere:

    python3 tests/data/families/make.py [--converter PATH/convert_hf_to_gguf.py] [FAMILY ...]

Needs torch, transformers and sentencepiece (pip), and llama.cpp's converter (default: the one in the
llama-cpp-python 0.3.36 sdist unpacked at /tmp/llama). Writes FAMILY.gguf and FAMILY.json here, and
spm-tokenize.jsonl (sentencepiece's own encoding of a few texts with the fixtures' vocabulary).

Every weight is stored as F32, so the GGUF holds exactly the weights transformers ran with. The vocabulary is a
512-piece SentencePiece model (256 of them byte pieces, as Llama's) trained on tests/data/jargon-intro.txt: the
converter reads it like any Llama-style tokenizer.model, and it keeps the embedding small. Weights are drawn
wider than transformers' default init (std 0.02 gives near-uniform logits, whose near-ties would make top-1 and
greedy comparisons a coin toss); the script records the smallest top-1/top-2 margin, and moves on to the next
seed while it is below 2e-3 (twice the logits tolerance).
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers as tf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DEFAULT_CONVERTER = Path("/tmp/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py")
VOCAB = 512
GREEDY = 32
MIN_MARGIN = 2e-3

# Small shapes shared by every family: 2-3 layers, width 64, 4 query heads over 2 key/value heads of 16.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def families():
    """name -> (config, model class)."""
    return {
        # q/k/v biases, NeoX rotation, untied output.
        "qwen2": (tf.Qwen2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=False, rope_theta=10000.0),
                  tf.Qwen2ForCausalLM),
        # Per-head q/k RMSNorm, tied output.
        "qwen3": (tf.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=16, tie_word_embeddings=True),
                  tf.Qwen3ForCausalLM),
        # Llama 3.1 rope scaling (rope_freqs.weight): a short original context so most frequencies are divided.
        "llama": (tf.LlamaConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=True,
                                 rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=32),
                                 rope_theta=500000.0),
                  tf.LlamaForCausalLM),
        # Fused qkv and gate/up.
        "phi3": (tf.Phi3Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
                               original_max_position_embeddings=256),
                 tf.Phi3ForCausalLM),
        # Soft-capping (small caps so they bend the values), alternating 8-token windows, pre and post norms.
        "gemma2": (tf.Gemma2Config(**COMMON, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=16,
                                   sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=10.0),
                   tf.Gemma2ForCausalLM),
        # 8 experts, top-2, renormalised (as Qwen3-30B-A3B's norm_topk_prob), in every layer.
        "qwen3moe": (tf.Qwen3MoeConfig(**COMMON, num_hidden_layers=2, head_dim=16, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                       decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
                     tf.Qwen3MoeForCausalLM),
    }


# The converter reads a Qwen3-MoE vocabulary only as a GPT-2-style BPE whose pre-tokenizer it recognises by a
# hash of real tokenizers' output, which a tiny vocabulary cannot match; so for that family only, the converter
# runs with its vocabulary step swapped for the SentencePiece reader the other families use. Tensors and
# hyper-parameters go through the converter untouched.
SPM_VOCAB_FOR = {"qwen3moe": "from conversion.qwen import Qwen3MoeModel as M"}
RUN_CONVERTER = """
import runpy, sys
from pathlib import Path
converter = Path(sys.argv[1])
sys.path[:0] = [str(converter.parent), str(converter.parent / "gguf-py")]
{import_model}
M.set_vocab = M._set_vocab_sentencepiece
sys.argv = sys.argv[1:]
runpy.run_path(str(converter), run_name="__main__")
"""


def make_tokenizer(out: Path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(ROOT / "tests/data/jargon-intro.txt"),
        model_prefix=str(out / "tokenizer"),
        vocab_size=VOCAB,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_id=0,
        # As Llama's and Phi-3's tokenizer.model: no normalisation, white space kept as written.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        byte_fallback=True,
        minloglevel=2,
    )


# Texts for the tokenizer check: the vocabulary's own prose, white space runs, digits, and characters it lacks.
TOKENIZE = [
    "The harbour town woke slowly.",
    "Hello world",
    " Hello  world",
    "hello\n\nworld\tend",
    "In 1983, version 2.0 shipped.",
    "  leading and trailing  ",
    "Ω and 😀 are unknown here",
    "",
]


def record_tokenize(tok_dir: Path):
    """sentencepiece's own encoding of TOKENIZE with the fixtures' vocabulary (add_dummy_prefix, as Llama and
    Phi-3 tokenizers use it), for the SPM flavour those GGUFs carry."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tok_dir / "tokenizer.model"))
    lines = [json.dumps({"text": t, "ids": sp.encode(t)}, ensure_ascii=False) for t in TOKENIZE]
    (HERE / "spm-tokenize.jsonl").write_text("\n".join(lines) + "\n")


def randomize(model, seed: int):
    """Weights wide enough that logits spread out: matrices N(0, 1/fan_in), norms 1 + N(0, 0.1²) (gemma stores the
    offset from 1, so N(0, 0.1²) there), biases N(0, 0.1²), embeddings N(0, 0.1²)
    (small beside the layers' outputs, or a tied output head would only echo the input token)."""
    g = torch.Generator().manual_seed(seed)
    gemma = "Gemma" in type(model).__name__
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(r * 0.1 + (0.0 if gemma else 1.0))
            elif name.endswith(".bias"):
                p.copy_(r * 0.1)
            elif "embed_tokens" in name:
                p.copy_(r * 0.1)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float32)


def margin(row):
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])


def build(name, config, cls, converter: Path, tok_dir: Path, seed: int):
    config._attn_implementation = "eager"
    model = cls(config).to(torch.float32).eval()
    randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    # Two sequences: a short one, and one longer than gemma2's window.
    seqs = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (7, 21)]
    logits = [logits_of(model, s) for s in seqs]
    margins = [margin(r) for l in logits for r in l]
    # Greedy continuation of the first sequence, recomputing everything each step (no cache to get wrong).
    ids = list(seqs[0])
    for _ in range(GREEDY):
        row = logits_of(model, ids)[-1]
        margins.append(margin(row))
        ids.append(int(torch.argmax(row)))
    greedy = ids[len(seqs[0]):]
    if min(margins) < MIN_MARGIN:
        print(f"{name}: seed {seed} has a top-1/top-2 margin of {min(margins):.5f}, too close to a tie")
        return False

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        model.save_pretrained(d, safe_serialization=True)
        (d / "tokenizer.model").write_bytes((tok_dir / "tokenizer.model").read_bytes())
        out = HERE / f"{name}.gguf"
        run = [sys.executable, str(converter)]
        if name in SPM_VOCAB_FOR:
            run = [sys.executable, "-c", RUN_CONVERTER.format(import_model=SPM_VOCAB_FOR[name]), str(converter)]
        args = [str(d), "--outfile", str(out), "--outtype", "f32", "--model-name", f"tiny-{name}"]
        subprocess.run(run + args, check=True, stdout=subprocess.DEVNULL)
    expected = {
        "family": name,
        "made_by": f"tests/data/families/make.py: transformers {tf.__version__}, torch {torch.__version__}, f32",
        "n_vocab": VOCAB,
        "sequences": seqs,
        "logits": [[[round(float(v), 6) for v in r] for r in l] for l in logits],
        "greedy_prompt": seqs[0],
        "greedy": greedy,
        "seed": seed,
        "min_margin": min(margins),
    }
    (HERE / f"{name}.json").write_text(json.dumps(expected, separators=(",", ":")) + "\n")
    print(f"{name}: seed {seed}, {out.stat().st_size} bytes, min top-1 margin {min(margins):.4f}, greedy {greedy}")
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--converter", type=Path, default=DEFAULT_CONVERTER)
    ap.add_argument("--seed", type=int, default=20, help="the first seed tried; later ones follow a near-tie")
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    all_families = families()
    wanted = args.families or list(all_families)
    with tempfile.TemporaryDirectory() as tok:
        tok = Path(tok)
        make_tokenizer(tok)
        record_tokenize(tok)
        for name in wanted:
            config, cls = all_families[name]
            if not any(build(name, config, cls, args.converter, tok, args.seed + i) for i in range(20)):
                sys.exit(f"{name}: no seed without a near-tie")


if __name__ == "__main__":
    main()
