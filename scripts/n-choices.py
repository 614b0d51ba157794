#!/usr/bin/env python3
"""One request of `n` choices against `n` concurrent requests of one choice, on a running `infer serve`.

Usage: scripts/n-choices.py http://127.0.0.1:8080 [N] [ROUNDS]

Every round uses a fresh ~400-token prompt (so the prefix cache cannot serve it from an earlier round), asks for
32 tokens per choice at temperature 0.8, and prints the wall time and, from /metrics, how many prompt tokens went
through the model (prompt tokens admitted minus prefix-cache hits) and how many forward passes ran.
"""
import concurrent.futures as cf
import itertools
import json
import sys
import time
import urllib.request

base = sys.argv[1].rstrip("/")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
text = "The history of the city goes back many centuries. " * 40
common = {"max_tokens": 32, "temperature": 0.8, "ignore_eos": True, "seed": 1}
fresh = itertools.count()


def post(body):
    req = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def metric(name):
    for line in urllib.request.urlopen(base + "/metrics").read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"no {name} in /metrics")


def one_request():
    prompt = f"Round {next(fresh)}. " + text
    post(dict(common, prompt=prompt, n=n))


def separate():
    prompt = f"Round {next(fresh)}. " + text
    with cf.ThreadPoolExecutor(n) as ex:
        list(ex.map(lambda i: post(dict(common, prompt=prompt, seed=1 + i)), range(n)))


names = ["infer_engine_steps_total", "infer_prompt_tokens_total", "infer_prefix_cache_hit_tokens_total"]
for _ in range(rounds):
    for label, run in [(f"n={n} in one request", one_request), (f"{n} requests of n=1", separate)]:
        before = [metric(m) for m in names]
        t = time.time()
        run()
        dt = time.time() - t
        steps, prompt, hits = (metric(m) - b for m, b in zip(names, before))
        print(f"{label:22s} {dt * 1000:7.0f} ms   prompt tokens computed {prompt - hits:5.0f}   steps {steps:4.0f}")
