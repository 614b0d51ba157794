#!/usr/bin/env bash
# Regenerates every speed table of the README's "Speed vs llama.cpp" section in one run: for each kernel level
# (the CPU's best, and AVX2 forced with INFER_ISA=avx2 against a llama.cpp built for AVX2 only), the seven files
# at depth 0 with the bandwidth limit, the compute peak and peak memory, the two shipped models at depth 4096, and
# the batched-decode pair B=1,16. It only runs scripts/bench-vs-llama.py; the figures are whatever the two programs print.
#
#   scripts/speed-tables.sh --native /path/to/llama.cpp/build/bin [--avx2 /path/to/llama.cpp/build-avx2/bin]
#                           [--out DIR] [--rounds N] [-r N]
#
# The SmolLM2 F32/F16/Q8_0/Q5_0/Q4_0 files are made once from the shipped Q4_1 with `llama-quantize
# --allow-requantize` (as ../shared/reference/README.md describes its requants) into target/bench-models/.
# Measure on a quiet host: both programs share the cores with anything else that runs.
set -euo pipefail
cd "$(dirname "$0")/.."

native="" avx2="" out="target/speed-tables" rounds=2 reps=3
while [ $# -gt 0 ]; do
    case "$1" in
        --native) native="$2"; shift 2 ;;
        --avx2) avx2="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "speed-tables.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$native" ] || { echo "speed-tables.sh: give --native DIR (llama.cpp's bin folder with llama-bench)" >&2; exit 2; }
for dir in "$native" ${avx2:+"$avx2"}; do
    for tool in llama-bench llama-batched-bench llama-completion llama-quantize; do
        [ -x "$dir/$tool" ] || { echo "speed-tables.sh: $dir/$tool not found" >&2; exit 2; }
    done
done

cargo build --release --quiet
infer=target/release/infer
"$infer" pull smollm2 gemma3 >&2
cached() { "$infer" list | awk -v n="$1" '$1 == n { print $NF }'; }
q41=$(cached smollm2) gemma=$(cached gemma3)
[ -f "$q41" ] && [ -f "$gemma" ] || { echo "speed-tables.sh: the registry's smollm2 and gemma3 are not cached" >&2; exit 1; }

models=target/bench-models
mkdir -p "$models" "$out"
for type in F32 F16 Q8_0 Q5_0 Q4_0; do
    f="$models/smollm2-$type.gguf"
    if [ ! -f "$f" ]; then
        "$native/llama-quantize" --allow-requantize "$q41" "$f.tmp" "$type" 2 > "$models/quant-$type.log" 2>&1
        mv "$f.tmp" "$f"
    fi
done
files=("$models"/smollm2-{F32,F16,Q8_0,Q5_0,Q4_0}.gguf "$q41" "$gemma")

bench() { python3 scripts/bench-vs-llama.py --infer "$infer" -t 2 -r "$reps" --rounds "$rounds" "$@"; }
table() {  # table NAME LLAMA_BIN [ISA]
    local name="$1" bin="$2" isa="${3:-}" flags=()
    [ -n "$isa" ] && flags=(--isa "$isa")
    echo "== $name: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD)"
    bench --llama-bin "$bin" "${flags[@]}" -p 512 -n 128 --bandwidth --peak --memory --wide "${files[@]}"
    echo
    bench --llama-bin "$bin" "${flags[@]}" -p 512 -n 128 -d 4096 --wide "$q41" "$gemma"
    echo
    bench --llama-bin "$bin" "${flags[@]}" -p 0 -n 16 --batch 1,16 "$q41"
    echo "== end: load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
simd=$("$infer" info "$q41" | sed -n 's/^simd: *//p')
echo "simd: $simd; $(grep -m1 'model name' /proc/cpuinfo)" | tee "$out/cpu.txt"
table "best level: $simd" "$native" 2>"$out/native.log" | tee "$out/native.md"
if [ -n "$avx2" ]; then
    table "INFER_ISA=avx2 against llama.cpp built for AVX2" "$avx2" avx2 2>"$out/avx2.log" | tee "$out/avx2.md"
fi
echo "tables in $out/"
