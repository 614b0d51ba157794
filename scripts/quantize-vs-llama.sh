#!/usr/bin/env bash
# infer quantize against llama-quantize, side by side: f32 GGUF -> q4_0 --pure on 2 threads, in interleaved
# rounds (llama-quantize, `infer quantize --rtn`, `infer quantize` with its default search), so that a burst of load
# from elsewhere hurts every side alike. Prints each side's best wall time and best CPU time (user + system) over
# the rounds, every round's figures, and the load average before and after.
#
#   scripts/quantize-vs-llama.sh [-r ROUNDS] [-t THREADS] LLAMA_QUANTIZE INFER F32_GGUF
#   scripts/quantize-vs-llama.sh -r 5 /tmp/llama/build-native/bin/llama-quantize target/release/infer \
#       /tmp/models/smollm2-F32.gguf
#
# Outputs go to a temporary folder, removed at the end; each output is deleted before its run, so that every side
# writes a new file. Needs GNU time (/usr/bin/time).
set -euo pipefail

rounds=3
threads=2
while getopts "r:t:" opt; do
    case $opt in
        r) rounds=$OPTARG ;;
        t) threads=$OPTARG ;;
        *) echo "usage: $0 [-r ROUNDS] [-t THREADS] LLAMA_QUANTIZE INFER F32_GGUF" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -ne 3 ]; then
    echo "usage: $0 [-r ROUNDS] [-t THREADS] LLAMA_QUANTIZE INFER F32_GGUF" >&2
    exit 2
fi
llama=$1
infer=$2
input=$3
[ -x /usr/bin/time ] || { echo "$0: needs GNU time at /usr/bin/time" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# run NAME OUT CMD...: one timed run, appended to $dir/times as "NAME wall user sys".
run() {
    local name=$1 out=$2
    shift 2
    rm -f "$out"
    if ! /usr/bin/time -f "$name %e %U %S" -o "$dir/t" "$@" >"$dir/log" 2>&1; then
        echo "$0: $name failed:" >&2
        cat "$dir/log" >&2
        exit 1
    fi
    cat "$dir/t" >>"$dir/times"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$rounds"); do
    run llama-quantize "$dir/llama.gguf" "$llama" --pure "$input" "$dir/llama.gguf" q4_0 "$threads"
    run "infer --rtn" "$dir/rtn.gguf" "$infer" quantize --pure --rtn -t "$threads" "$input" "$dir/rtn.gguf" q4_0
    run "infer default" "$dir/search.gguf" "$infer" quantize --pure -t "$threads" "$input" "$dir/search.gguf" q4_0
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
if cmp -s "$dir/llama.gguf" "$dir/rtn.gguf"; then
    echo "--rtn output: byte-identical to llama-quantize's"
else
    echo "--rtn output: DIFFERS from llama-quantize's"
fi
# Names have one space at most ("infer default"): join the first two fields when there are five.
awk '{ if (NF == 5) { name = $1 " " $2; w = $3; c = $4 + $5 } else { name = $1; w = $2; c = $3 + $4 }
       if (!(name in bw) || w < bw[name]) bw[name] = w
       if (!(name in bc) || c < bc[name]) bc[name] = c
       rounds[name] = rounds[name] sprintf(" %.2f/%.2f", w, c) }
     END { printf "%-15s %14s %14s   %s\n", "", "best wall (s)", "best CPU (s)", "each round: wall/CPU (s)"
           split("llama-quantize|infer --rtn|infer default", names, "|")
           for (i = 1; i <= 3; i++) { k = names[i]; printf "%-15s %14.2f %14.2f  %s\n", k, bw[k], bc[k], rounds[k] } }' \
    "$dir/times"
