#!/usr/bin/env python3
"""infer against llama.cpp, side by side in one run: `infer bench` and `llama-bench` (and, with --batch,
`llama-batched-bench`) take turns on each model for several rounds, and each side's best rate per test is kept,
so that a neighbour's burst of load on a shared machine hurts both sides alike and rarely both of their rounds.

    scripts/bench-vs-llama.py --llama-bin /tmp/llama/build-avx2/bin --isa avx2 -p 512 -n 128 -t 2 \\
        ~/.cache/infer/models/SmolLM2-135M-Instruct.Q4_1.gguf ...

prints a markdown table: per model and test, the best t/s of each side and their ratio. `-d 0,4096` adds the
depth tests (llama-bench's -d; llama.cpp's best over --fa settings), `--batch 1,16` the batched-decode curve
(S_TG of `infer bench --batch` against llama-batched-bench), `--bandwidth` infer's memory read probe, which
turns each tg rate into a share of the bandwidth limit (model bytes per token over the read rate), `--peak` its
compute-peak probe, which turns each pp rate into a share of the peak of the multiply-add its kernels run on, and
`--memory`
the peak resident memory of a short `infer run` against `llama-completion` with the same file, context and prompt
(each side's lowest over the rounds, next to the limit "file + KV cache + 10%"). `--wide` prints one row per model
and one column pair per test, the layout of the README's speed tables.

Only the Python standard library is needed. Nothing here decides a result: the script runs the two programs and
reports what they print.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def counts(text):
    return [int(v) for v in text.split(",") if v.strip()]


def run_json(cmd, env=None, jsonl=False):
    """Runs `cmd` and parses its stdout as JSON (or JSON lines); stderr passes through only on failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    if jsonl:
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip().startswith("{")]
    return json.loads(proc.stdout)


def peak_rss_mib(cmd, env=None):
    """Runs `cmd` (output discarded but for infer's stderr) and returns (its peak resident set in MiB, its stderr).
    os.wait4 gives this child's own rusage, so nothing else the script ran is counted."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    err = proc.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(err)
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return usage.ru_maxrss / 1024.0, err  # Linux reports ru_maxrss in KiB


def kv_reserved_mib(stderr):
    """The KV cache's reserved size from `infer run -v`'s memory line ("KV 90.0 MiB reserved")."""
    m = re.search(r"KV ([0-9.]+) (KiB|MiB|GiB) reserved", stderr)
    if not m:
        raise SystemExit("infer run -v printed no 'KV ... reserved' memory line")
    return float(m.group(1)) * {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[m.group(2)]


def keep_best(best, key, rate, extra=None):
    if rate > best.get(key, (0.0, None))[0]:
        best[key] = (rate, extra)


def progress(engine, rec, rate):
    """One line per result on stderr as it comes, so that an interrupted run still leaves its figures."""
    if "s_tg" in rec or "n_prompt" not in rec:
        what = f"B={rec['batch']}"
    else:
        what = f"pp{rec['n_prompt']} tg{rec['n_gen']} d{rec.get('n_depth', 0)}"
    probe = f" (memory read {rec['mem_read_gbs']:.1f} GB/s)" if rec.get("mem_read_gbs") else ""
    print(f"  {engine}: {what}: {rate:.1f} t/s{probe}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help=".gguf files (infer and llama.cpp load the same file)")
    ap.add_argument("--infer", default=str(REPO / "target" / "release" / "infer"), help="the infer binary")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", ""),
                    help="directory holding llama-bench and llama-batched-bench (default: $LLAMA_BIN, else PATH)")
    ap.add_argument("--isa", help="INFER_ISA for infer (scalar, avx2, avx512, amx); default: the best the CPU has")
    ap.add_argument("-p", default="512", help="prompt lengths (comma-separated; 0 = none)")
    ap.add_argument("-n", default="128", help="generation lengths (comma-separated; 0 = none)")
    ap.add_argument("-d", default="0", help="depths (comma-separated), as llama-bench's -d")
    ap.add_argument("-t", type=int, default=2, help="threads for both")
    ap.add_argument("-r", type=int, default=3, help="repetitions per round (both programs' -r)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each side's best round counts")
    ap.add_argument("--fa", default="0,1", help="llama-bench flash-attention settings to try (its -fa), best kept")
    ap.add_argument("--batch", default="", help="batch sizes for the batched-decode curve (e.g. 1,16)")
    ap.add_argument("--batch-prompt", type=int, default=16)
    ap.add_argument("--batch-gen", type=int, default=24)
    ap.add_argument("--bandwidth", action="store_true", help="run infer's memory read probe in each round")
    ap.add_argument("--peak", action="store_true",
                    help="run infer's compute-peak probe in each round (each pp rate's share of the peak it runs on)")
    ap.add_argument("--memory", action="store_true",
                    help="also compare peak RSS: `infer run` against llama-completion, same file, context and prompt")
    ap.add_argument("--memory-ctx", type=int, default=4096, help="context size of the --memory runs (-c)")
    ap.add_argument("--memory-prompt", default="The capital of France is", help="prompt of the --memory runs")
    ap.add_argument("--memory-gen", type=int, default=16, help="tokens generated in the --memory runs")
    ap.add_argument("--wide", action="store_true",
                    help="one row per model, a column pair per test (the README's layout)")
    ap.add_argument("--json", help="also write every raw record to this file")
    args = ap.parse_args()

    def tool(name):
        path = Path(args.llama_bin) / name if args.llama_bin else shutil.which(name)
        if not path or not Path(path).exists():
            raise SystemExit(f"{name} not found (give --llama-bin DIR or set LLAMA_BIN)")
        return str(path)

    llama_bench = tool("llama-bench")
    batched_bench = tool("llama-batched-bench") if args.batch else None
    completion = tool("llama-completion") if args.memory else None
    if not Path(args.infer).exists():
        raise SystemExit(f"{args.infer} not found (cargo build --release, or give --infer)")
    env = dict(os.environ)
    if args.isa:
        env["INFER_ISA"] = args.isa
    fa = [v for v in args.fa.split(",") if v]
    fa_flag = ",".join({"0": "off", "1": "on"}.get(v, v) for v in fa)
    # `-p 0 -n 0 --batch ...` asks for the batched curve alone: neither bench has a test to run then.
    plain = any(counts(args.p)) or any(counts(args.n)) or not args.batch

    ours, theirs, raw = {}, {}, []
    rss = {}  # model name -> {"infer": MiB, "llama.cpp": MiB, "kv": MiB}, the lowest peak of the rounds
    bandwidth = 0.0
    per_rate = {}  # pp key -> share of the compute peak per token/s (lowest: the round with the highest peak)
    unshared = set()  # (model, level) whose pp came back from --peak without a share
    for rnd in range(args.rounds):
        for model in args.models:
            name = Path(model).name
            print(f"round {rnd + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            common = ["-p", args.p, "-n", args.n, "-d", args.d, "-t", str(args.t), "-r", str(args.r), "-o", "json"]
            extra = (["--bandwidth"] if args.bandwidth else []) + (["--peak"] if args.peak else [])
            for rec in run_json([args.infer, "bench", model, *common, *extra], env) if plain else []:
                raw.append({"engine": "infer", **rec})
                key = (name, rec["n_prompt"], rec["n_gen"], rec["n_depth"])
                keep_best(ours, key, rec["avg_ts"], rec.get("mem_read_gbs"))
                progress("infer", rec, rec["avg_ts"])
                bandwidth = max(bandwidth, rec.get("mem_read_gbs") or 0.0)
                if rec.get("peak_share") and rec["avg_ts"]:
                    per_rate[key] = min(per_rate.get(key, 1e9), rec["peak_share"] / rec["avg_ts"])
                elif args.peak and rec["n_prompt"]:
                    unshared.add((name, rec.get("isa") or "this"))
            for rec in run_json([llama_bench, "-m", model, *common, "-fa", fa_flag]) if plain else []:
                raw.append({"engine": "llama.cpp", **rec})
                key = (name, rec["n_prompt"], rec["n_gen"], rec["n_depth"])
                keep_best(theirs, key, rec["avg_ts"], f"fa {rec.get('flash_attn')}")
                progress(f"llama.cpp fa {rec.get('flash_attn')}", rec, rec["avg_ts"])
            if args.batch:
                b = ["--batch", args.batch, "--batch-prompt", str(args.batch_prompt)]
                b += ["--batch-gen", str(args.batch_gen), "-t", str(args.t), "-r", str(args.r), "-o", "json"]
                for rec in run_json([args.infer, "bench", model, *b], env):
                    raw.append({"engine": "infer", **rec})
                    keep_best(ours, (name, "batch", rec["batch"]), rec["s_tg"])
                    progress("infer", rec, rec["s_tg"])
                ctx = max(counts(args.batch)) * (args.batch_prompt + args.batch_gen) + 256
                cmd = [batched_bench, "-m", model, "-c", str(ctx), "-npp", str(args.batch_prompt)]
                cmd += ["-ntg", str(args.batch_gen), "-npl", args.batch, "-t", str(args.t), "--output-format", "jsonl"]
                for _ in range(args.r):
                    for rec in run_json(cmd, jsonl=True):
                        raw.append({"engine": "llama.cpp", **rec})
                        keep_best(theirs, (name, "batch", rec["pl"]), rec["speed_tg"])
                        progress("llama-batched-bench", {"batch": rec["pl"]}, rec["speed_tg"])

            if args.memory:
                mem = rss.setdefault(name, {})
                run = [args.infer, "run", model, "-p", args.memory_prompt, "-n", str(args.memory_gen)]
                run += ["-c", str(args.memory_ctx), "-t", str(args.t), "--seed", "1", "-v"]
                ours_mib, err = peak_rss_mib(run, env)
                mem["kv"] = kv_reserved_mib(err)
                cmd = [completion, "-m", model, "-c", str(args.memory_ctx), "-p", args.memory_prompt]
                cmd += ["-n", str(args.memory_gen), "-t", str(args.t), "-no-cnv", "--seed", "1"]
                theirs_mib, _ = peak_rss_mib(cmd)
                for engine, mib in (("infer", ours_mib), ("llama.cpp", theirs_mib)):
                    mem[engine] = min(mem.get(engine, mib), mib)
                    raw.append({"engine": engine, "model_filename": model, "peak_rss_mib": mib})
                print(f"  peak RSS: infer {ours_mib:.1f} MiB, llama-completion {theirs_mib:.1f} MiB",
                      file=sys.stderr, flush=True)

    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    sizes = {}  # the weights' bytes (what a token reads), as infer bench reports them
    for rec in raw:
        if rec["engine"] == "infer" and "model_size" in rec:
            sizes[Path(rec["model_filename"]).name] = rec["model_size"]
    files = {Path(m).name: os.path.getsize(m) for m in args.models}  # the whole file, for the memory limit

    isa = args.isa or "best"
    print(f"infer (INFER_ISA={isa}) and llama.cpp, {args.t} threads, best of {args.rounds} interleaved rounds "
          f"of -r {args.r}, t/s\n")

    def order(key):
        # Per model: pp tests, then tg, each by depth and length; then the batching curve by batch size.
        if key[1] == "batch":
            return (key[0], 2, 0, key[2], 0)
        return (key[0], 0 if key[1] else 1, key[3], key[1] or key[2], 0)

    def test_name(key):
        if key[1] == "batch":
            return f"S_TG at B={key[2]} (pp{args.batch_prompt}+tg{args.batch_gen})"
        _, pp, tg, depth = key
        return (f"pp{pp}" if pp else f"tg{tg}") + (f" @ d{depth}" if depth else "")

    def limit_tps(key):
        """The bandwidth limit of a tg test without depth (t/s: the read rate over the weights' bytes), or None."""
        if not (args.bandwidth and bandwidth) or key[1] == "batch" or not key[2] or key[3] or key[0] not in sizes:
            return None
        return bandwidth * 1e9 / sizes[key[0]]

    def limit_share(key, rate):
        """A tg rate's share of the bandwidth limit, or None."""
        limit = limit_tps(key)
        return rate / limit if limit else None

    def peak_share(key, rate):
        """A pp rate's share of the compute peak its kernels run on, or None."""
        return rate * per_rate[key] if key in per_rate else None

    keys = sorted(set(ours) | set(theirs), key=order)
    if args.wide:
        print_wide(args, keys, ours, theirs, rss, files, test_name, limit_share, bandwidth, peak_share)
        print_unshared(unshared)
        return
    print("| model | test | infer | llama.cpp | infer ÷ llama.cpp |")
    print("|---|---|---|---|---|")
    for key in keys:
        name, test = key[0], test_name(key)
        a, b = ours.get(key, (0.0, None))[0], theirs.get(key, (0.0, None))[0]
        ratio = f"{a / b:.2f}" if a and b else "-"
        note = ""
        if key[1] != "batch" and theirs.get(key, (0, None))[1] and key[3]:
            note = f" ({theirs[key][1]})"
        print(f"| {name} | {test} | {a:.1f} | {b:.1f}{note} | {ratio} |")
    if args.batch:
        for model in args.models:
            name = Path(model).name
            b1 = ours.get((name, "batch", 1), (0.0,))[0]
            for bsz in counts(args.batch):
                if bsz > 1 and b1:
                    s = ours.get((name, "batch", bsz), (0.0,))[0]
                    print(f"\n{name}: infer B={bsz} ÷ infer B=1 = {s / b1:.2f}")
    print_memory(args, rss, files)
    print_unshared(unshared)
    if args.bandwidth and bandwidth:
        print(f"\nmemory read probe (infer bench --bandwidth, {args.t} threads, best round): {bandwidth:.1f} GB/s")
        for key, (rate, _) in sorted(ours.items(), key=lambda kv: order(kv[0])):
            limit = limit_tps(key)
            if limit:
                print(f"{key[0]} tg{key[2]}: {rate:.1f} t/s = {100 * rate / limit:.0f}% of the limit "
                      f"{limit:.0f} t/s ({sizes[key[0]] / 1e6:.1f} MB per token)")
    if per_rate:
        print("\ncompute peak (infer bench --peak: the f32 FMA for float weights, the level's integer multiply-add "
              "for quantized ones; best round):")
        for key in sorted(per_rate, key=order):
            rate = ours[key][0]
            print(f"{key[0]} {test_name(key)}: {rate:.1f} t/s = {100 * peak_share(key, rate):.0f}% of the peak")


def print_unshared(unshared):
    """Says which files' prefill got no share of the compute peak, so a missing column is not read as an omission."""
    for model, isa in sorted(unshared):
        print(f"\n{model}: no share of the compute peak at the {isa} level (infer bench --peak gives none where the "
              "products run on AMX tiles, whose peak is not probed)")


def memory_limit_mib(mem, file_bytes):
    """#19's limit: the file plus the KV cache plus 10%."""
    return (file_bytes / 2**20 + mem["kv"]) * 1.1


def print_memory(args, rss, files):
    if not rss:
        return
    print(f"\npeak RSS, MiB (`infer run` and `llama-completion`, -c {args.memory_ctx}, {args.memory_gen} tokens, "
          f"lowest of {args.rounds} rounds):\n")
    print("| model | infer | llama.cpp | file + KV + 10% |")
    print("|---|---|---|---|")
    for name, mem in rss.items():
        limit = f"{memory_limit_mib(mem, files[name]):.1f}"
        print(f"| {name} | {mem['infer']:.1f} | {mem['llama.cpp']:.1f} | {limit} |")


def print_wide(args, keys, ours, theirs, rss, files, test_name, limit_share, bandwidth, peak_share):
    """One row per model: each test's "infer / llama.cpp" and ratio, the tg share of the bandwidth limit, the pp
    share of the compute peak, and the peak RSS pair."""
    # Rows in the order the files were given, which is the README's order.
    present = {k[0] for k in keys}
    models = [n for n in dict.fromkeys(Path(m).name for m in args.models) if n in present]

    def shares(t):
        # A test gets a bandwidth-share column when some file has a limit for it (tg without depth, probe run).
        return any(limit_share((m, *t), 1.0) is not None for m in models)

    def peaks(t):
        # A pp test gets a compute-share column when some file has a probe for it.
        return any(peak_share((m, *t), 1.0) is not None for m in models)

    tests = []
    for key in keys:
        t = key[1:]
        if t not in tests:
            tests.append(t)
    head, rule = ["file"], ["---"]
    for t in tests:
        name = test_name((None, *t))
        head += [f"{name} infer / llama.cpp", "ratio"]
        rule += ["---", "---"]
        if shares(t):
            head.append(f"{name} share of the bandwidth limit")
            rule.append("---")
        if peaks(t):
            head.append(f"{name} share of the compute peak")
            rule.append("---")
    if rss:
        head += [f"peak RSS -c {args.memory_ctx}, MiB, infer / llama.cpp", "file + KV + 10%"]
        rule += ["---", "---"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(rule) + "|")
    for model in models:
        row = [model]
        for t in tests:
            key = (model, *t)
            a, b = ours.get(key, (0.0, None))[0], theirs.get(key, (0.0, None))[0]
            row += [f"{a:.1f} / {b:.1f}", f"{a / b:.2f}" if a and b else "-"]
            if shares(t):
                share = limit_share(key, a)
                row.append(f"{100 * share:.0f}%" if share is not None else "-")
            if peaks(t):
                share = peak_share(key, a)
                row.append(f"{100 * share:.0f}%" if share is not None else "-")
        if rss:
            mem = rss.get(model)
            if mem:
                limit = f"{memory_limit_mib(mem, files[model]):.1f}"
                row += [f"{mem['infer']:.1f} / {mem['llama.cpp']:.1f}", limit]
            else:
                row += ["-", "-"]
        print("| " + " | ".join(row) + " |")
    if args.bandwidth and bandwidth:
        print(f"\nmemory read probe (infer bench --bandwidth, {args.t} threads, best round): {bandwidth:.1f} GB/s")


if __name__ == "__main__":
    main()
