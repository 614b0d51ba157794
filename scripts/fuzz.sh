#!/usr/bin/env bash
# Runs infer's fuzz targets (fuzz/, cargo-fuzz + libFuzzer, AddressSanitizer on) for SECONDS each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 20 s, every target (.ci/run's smoke run)
#   FUZZ_JOBS=2 scripts/fuzz.sh 600            two targets at a time (a long run)
#
# A failure is a panic or a sanitizer report (a crash), an input that takes over 1 s (-timeout=1), or more than
# 2 GiB of memory (-rss_limit_mb=2048): libFuzzer then writes the input to fuzz/artifacts/TARGET/ and this script
# fails. Turn such an input into a regression test (tests/fuzz_findings.rs) before fixing it.
#
# The corpora grow in fuzz/corpus/TARGET (not in git). They start from fuzz/seeds/TARGET (small, in git) and from
# seeds made here from the registry models in $INFER_HOME (their GGUF headers and chat templates) and tests/data.
# Each target's last libFuzzer status line (runs, coverage, executions per second) goes to fuzz/summary.txt.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-20}
shift || true
targets=("$@")
jobs=${FUZZ_JOBS:-1}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "error: the nightly toolchain is missing (rustup toolchain install nightly); cargo-fuzz needs it" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "error: cargo-fuzz is missing (cargo install cargo-fuzz)" >&2
    exit 1
fi

home=${INFER_HOME:-$HOME/.cache/infer}
models=("$home/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$home/models/gemma-3-270m-q4_k_m.gguf")
for m in "${models[@]}"; do
    if [ ! -f "$m" ]; then
        echo "error: $m is missing (infer pull smollm2 gemma3): the tokenizer target and the seeds need it" >&2
        exit 1
    fi
done
export INFER_HOME=$home
if [ ${#targets[@]} -eq 0 ]; then
    # Every [[bin]] of fuzz/Cargo.toml: a new target is run here as soon as it is declared there.
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Seeds made from the models and test files, not kept in git.
gen=fuzz/target/seeds
rm -rf "$gen"
mkdir -p "$gen"/{gguf,tokenizer,chat_template,models_toml}
for m in "${models[@]}"; do
    # The header, the metadata and as many tensor records as fit in 64 KiB.
    head -c 65536 "$m" > "$gen/gguf/$(basename "$m" .gguf).head"
done
for m in "${models[@]}"; do
    # The model's chat template (infer info, fast; gguf-py takes minutes over a 262k-token vocabulary), then NUL-
    # separated BOS, EOS and messages, as fuzz_targets/chat_template.rs reads them.
    cargo run --quiet -- info "$m" --json | python3 -c '
import json, sys
t = json.load(sys.stdin)["metadata"].get("tokenizer.chat_template")
if isinstance(t, str):
    sys.stdout.buffer.write(t.encode() + "\0<s>\0</s>\0system\0Be brief.\0user\0Hello \u2603\0assistant\0Hi.\0user\0Bye".encode())
' >"$gen/chat_template/$(basename "$m" .gguf).jinja"
done
find "$gen/chat_template" -empty -delete # (a model without a template)
i=0
for f in tests/data/*.txt; do
    # The first byte picks the tokenizer and the special-token flags (see fuzz_targets/tokenizer.rs).
    for flags in '\x00' '\x01' '\x06' '\x07'; do
        { printf "$flags"; head -c 2048 "$f"; } > "$gen/tokenizer/$i"
        i=$((i + 1))
    done
done
cp models.toml "$gen/models_toml/"

echo "building the fuzz targets (cargo +nightly fuzz build, release + AddressSanitizer)"
cargo +nightly fuzz build

run_one() {
    local t=$1 log=fuzz/target/$1.log
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    local dirs=("fuzz/corpus/$t")
    [ -d "fuzz/seeds/$t" ] && dirs+=("fuzz/seeds/$t")
    [ -d "$gen/$t" ] && dirs+=("$gen/$t")
    # Raw-byte targets get room for the real headers and templates; the structured ones keep libFuzzer's default.
    local len=()
    case $t in
    gguf | tokenizer | chat_template | models_toml) len=(-max_len=65536) ;;
    # Past the target's 4 KiB body limit, so that reading a body too large is tried too.
    openai) len=(-max_len=8192) ;;
    esac
    if cargo +nightly fuzz run "$t" "${dirs[@]}" -- -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 \
        "${len[@]}" -print_final_stats=1 >"$log" 2>&1; then
        local stats
        stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" |
            sed 's/^stat:://' | tr '\n' ' ')
        echo "$t: ok: $(grep -E '^#[0-9]+' "$log" | tail -1 | sed 's/^#[0-9]* *//') | $stats"
    else
        echo "$t: FAILED (see $log and fuzz/artifacts/$t):"
        grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -5
        return 1
    fi
}

failed=0
summary=fuzz/summary.txt
: >"$summary"
running=0
pids=()
for t in "${targets[@]}"; do
    echo "fuzzing $t for ${secs}s"
    run_one "$t" >>"$summary" &
    pids+=($!)
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
        running=$((running - 1))
    fi
done
for p in "${pids[@]}"; do
    wait "$p" || failed=1
done
cat "$summary"
if [ "$failed" -ne 0 ]; then
    echo "error: a fuzz target failed" >&2
    exit 1
fi
