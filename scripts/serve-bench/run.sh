#!/usr/bin/env bash
# infer serve beside llama-server, one server at a time on loopback, with infer's own load generator
# (`infer bench --serve`): the README's "Load generator" tables. Each test writes its JSON into OUT and the
# summary rows are printed at the end.
#
#   scripts/serve-bench/run.sh [-t THREADS] [--llama-server PATH] [--out DIR] [MODEL.gguf]
#
# Defaults: 2 threads, target/release/infer, llama-server from $LLAMA_BIN (e.g. a build of the llama.cpp that the
# llama-cpp-python 0.3.36 sdist vendors), SmolLM2 Q4_1 from infer's model cache. short.jsonl holds 8 prompts of 32
# words, long.jsonl the same with one of them 2,000 words long: used in turn, 2 of 16 requests are long.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
INFER=${INFER:-$here/../../target/release/infer}
LLAMA_SERVER=${LLAMA_BIN:-/tmp/llama/build-native/bin}/llama-server
THREADS=2
OUT=$(mktemp -d)
while [ $# -gt 0 ]; do
  case $1 in
    -t) THREADS=$2; shift 2 ;;
    --llama-server) LLAMA_SERVER=$2; shift 2 ;;
    --out) OUT=$2; mkdir -p "$OUT"; shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) MODEL=$1; shift ;;
  esac
done
[ -x "$INFER" ] || { echo "infer not built: $INFER (cargo build --release)" >&2; exit 1; }
if [ -z "${MODEL:-}" ]; then
  MODEL=${INFER_HOME:-$HOME/.cache/infer}/models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$MODEL" ] || "$INFER" pull smollm2 >&2
fi
[ -f "$MODEL" ] || { echo "model not found: $MODEL" >&2; exit 1; }
echo "results in $OUT" >&2

SPID=
wait_up() { for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; echo "server at $1 did not come up" >&2; return 1; }
start() { # name port command...
  local name=$1 port=$2; shift 2
  "$@" >"$OUT/$name.log" 2>&1 & SPID=$!
  wait_up "http://127.0.0.1:$port"
}
stop() { [ -n "$SPID" ] && kill -INT "$SPID" && wait "$SPID" 2>/dev/null || true; SPID=; }
trap stop EXIT
infer_serve() { start "infer-$1" "$1" "$INFER" serve "$MODEL" --port "$1" -t "$THREADS" "${@:2}"; }
llama_serve() { start "llama-$1" "$1" "$LLAMA_SERVER" -m "$MODEL" --port "$1" -np 16 -c 16384 -t "$THREADS"; }
load() { "$INFER" bench --serve "http://127.0.0.1:$1" -o json "${@:2}"; }

T="--prompt-len 32 --gen-len 128 --ignore-eos"
for round in 1 2; do
  infer_serve 8090
  load 8090 $T --concurrency 16 --num-prompts 16 --label "infer serve, round $round" >"$OUT/t16-infer-$round.json"
  load 8090 $T --concurrency 1 --num-prompts 3 --label "infer serve, round $round" >"$OUT/t1-infer-$round.json"
  stop
  "$INFER" bench "$MODEL" --batch 16 --batch-prompt 32 --batch-gen 128 -r 1 -t "$THREADS" -o json >"$OUT/batch16-$round.json"
  if [ -x "$LLAMA_SERVER" ]; then
    llama_serve 8091
    load 8091 $T --concurrency 16 --num-prompts 16 --label "llama-server, round $round" >"$OUT/t16-llama-$round.json"
    load 8091 $T --concurrency 1 --num-prompts 3 --label "llama-server, round $round" >"$OUT/t1-llama-$round.json"
    stop
  fi
done

C="--concurrency 8 --rate 2 --num-prompts 16 --gen-len 64 --ignore-eos --seed 3"
infer_serve 8092 --no-prefix-cache
for round in 1 2 3; do
  load 8092 $C --prompts "$here/short.jsonl" --label "16 prompts of 32 words, round $round" >"$OUT/chunk-short-$round.json"
  load 8092 $C --prompts "$here/long.jsonl" --label "2 of the 16 are 2,000 words, round $round" >"$OUT/chunk-long-$round.json"
done
stop

P="--concurrency 1 --num-prompts 6 --endpoint chat --shared-prefix 400 --prompt-len 16 --gen-len 8 --ignore-eos"
infer_serve 8093
load 8093 $P --label "infer serve" >"$OUT/prefix-infer.json"
curl -s http://127.0.0.1:8093/metrics | grep -E '^infer_prefix|^infer_prompt' >"$OUT/prefix-infer.metrics"
stop
infer_serve 8094 --no-prefix-cache
load 8094 $P --label "infer serve --no-prefix-cache" >"$OUT/prefix-nocache.json"
stop
if [ -x "$LLAMA_SERVER" ]; then
  llama_serve 8095
  load 8095 $P --label "llama-server -np 16" >"$OUT/prefix-llama.json"
  stop
fi

python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    for r in json.load(open(f)):
        if "ttft_ms" in r:
            print(f"| {r.get('label', os.path.basename(f))} | {r['max_concurrency']} | {r['output_throughput']:.1f} | "
                  f"{r['ttft_ms']['median']:.0f} | {r['itl_ms']['median']:.1f} | {r['itl_ms']['p99']:.1f} | "
                  f"{r['e2el_ms']['median'] / 1000:.1f} |")
        else:
            print(f"| {os.path.basename(f)} | batch {r['batch']} | generation {r['s_tg']:.1f} t/s, "
                  f"prefill+generation {r['batch'] * r['n_gen'] / (r['t_pp'] + r['t_tg']):.1f} t/s |")
PY
