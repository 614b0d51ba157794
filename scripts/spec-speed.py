#!/usr/bin/env python3
"""Decode speed with and without speculative decoding (prompt lookup), side by side in one run.

For each model and task, `infer run --chat --json` runs with `--spec-type none` and `--spec-type ngram`, alternating
which goes first, for --rounds rounds; the table shows each side's best generation rate, their ratio, the guesses
fed and how many stood. It also checks that both sides generated the same tokens (the point of the method).

    scripts/spec-speed.py [--infer target/release/infer] [--models smollm2,gemma3] [--rounds 2] [-n 200] [-t 2]
                          [--temp 0] [--seed 1]

Measure on a quiet host: the rates are wall-clock.
"""

import argparse
import json
import subprocess
import sys

PARAGRAPH = (
    "The Apollo program was the third United States human spaceflight program carried out by the National "
    "Aeronautics and Space Administration (NASA), which succeeded in preparing and landing the first humans on the "
    "Moon from 1968 to 1972. It was first conceived in 1960 during President Dwight D. Eisenhower's administration "
    "as a three-person spacecraft to follow the one-person Project Mercury, which put the first Americans in space. "
    "Apollo was later dedicated to President John F. Kennedy's national goal for the 1960s of landing a man on the "
    "Moon and returning him safely to the Earth, in an address to Congress on May 25, 1961."
)

CODE = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, email = line.strip().split(",")
            users.append({"name": name, "age": int(age), "email": email})
    return users
'''

TASKS = [
    ("quote", f"Repeat the following text exactly:\n{PARAGRAPH}"),
    ("edit code", f"Rename the function load_users to read_users and the variable users to rows:\n{CODE}"),
    ("summarize", f"Summarize this text in two sentences:\n{PARAGRAPH}"),
    ("story", "Write a short story about a lighthouse keeper who finds a strange bottle."),
]


def run(args, model, prompt, spec):
    cmd = [args.infer, "run", model, "--chat", "-p", prompt, "-n", str(args.n), "-t", str(args.threads),
           "--temp", str(args.temp), "--seed", str(args.seed), "--json", "--spec-type", spec]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"spec-speed: {' '.join(cmd[:3])} ... failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--infer", default="target/release/infer")
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-n", type=int, default=200)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    print("| model | task | tokens | plain t/s | speculative t/s | ratio | guesses stood | same tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for model in args.models.split(","):
        for name, prompt in TASKS:
            best = {"none": 0.0, "ngram": 0.0}
            results = {}
            for r in range(args.rounds):
                order = ["none", "ngram"] if r % 2 == 0 else ["ngram", "none"]
                for spec in order:
                    v = run(args, model, prompt, spec)
                    results[spec] = v
                    best[spec] = max(best[spec], v["timings"]["generation_tokens_per_second"])
            t = results["ngram"]["timings"]
            same = results["none"]["tokens"] == results["ngram"]["tokens"]
            print(f"| {model} | {name} | {len(results['ngram']['tokens'])} | {best['none']:.1f} | "
                  f"{best['ngram']:.1f} | {best['ngram'] / best['none']:.2f} | "
                  f"{t['draft_accepted']}/{t['draft_tokens']} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
