#!/usr/bin/env bash
# AddressSanitizer over the code that holds nearly all of infer's `unsafe`: the kernels' tests at every SIMD level
# this CPU has, then a short generation with the real SmolLM2 model at each level. .ci/run calls it.
#
#   scripts/sanitize.sh              the kernel tests at every level (what .ci/run runs)
#   scripts/sanitize.sh --generate   and a short SmolLM2 generation at every level
#
# Needs the nightly toolchain (-Zsanitizer is unstable). It has no rust-src component, so std itself is not
# rebuilt with instrumentation (-Zbuild-std): ASan checks our code and the crates we build, and intercepts malloc
# and free for everything. The builds go to target/asan, apart from the normal ones.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "error: the nightly toolchain is missing (rustup toolchain install nightly); -Zsanitizer needs it" >&2
    exit 1
fi
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer"
export RUSTDOCFLAGS=$RUSTFLAGS
export CARGO_TARGET_DIR=target/asan
# Leak checks off: the budget tests leave their over-limit allocations behind on purpose (see kernels/src/budget.rs).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}

levels=(scalar)
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
    levels+=(avx2)
    if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
        grep -qw avx512_vnni /proc/cpuinfo; then
        levels+=(avx512)
    else
        echo "note: this CPU lacks AVX-512 VNNI: the avx512 level is NOT RUN under the sanitizer"
    fi
else
    echo "note: this CPU lacks AVX2/FMA/F16C: the avx2 and avx512 levels are NOT RUN under the sanitizer"
fi

# The kernels at opt-level 1 here, not the dev profile's 3: ASan's checks on every access make LLVM's work at 3 the
# bulk of this script's time. On a 2-core Zen 1 (2026-12-04) the kernels' test build took about 11 min at 3 against
# 7 at 1, and the two levels' test runs 37 s against 97 s: about 12 min in all against 9. The checks at 1 also see
# the accesses more as written, with fewer of them merged or removed by the optimizer.
opt=(--config 'profile.dev.package.infer-kernels.opt-level=1')
# --target keeps the instrumentation off build scripts and proc-macros (they run on the host, unsanitized).
echo "==> kernel tests under AddressSanitizer (levels: ${levels[*]})"
cargo +nightly test -q -p infer-kernels --target "$host" "${opt[@]}" --no-run
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for isa in "${levels[@]}"; do
    # The simd tests loop over every level themselves; INFER_ISA picks the level of the matmul drivers and the rest.
    if ! INFER_ISA=$isa cargo +nightly test -q -p infer-kernels --target "$host" "${opt[@]}" >"$log" 2>&1; then
        tail -40 "$log" >&2
        echo "error: the kernel tests failed under AddressSanitizer at INFER_ISA=$isa" >&2
        exit 1
    fi
    echo "--> INFER_ISA=$isa: $(awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed", p, f }' "$log")"
done

# The generation needs a third whole build of infer (about 5 minutes on 2 cores). CI skips it: its fuzz smoke run
# already drives a whole model load and forward pass under AddressSanitizer (the `model` and `forward` targets).
if [ "${1:-}" != "--generate" ]; then
    echo "sanitizer runs: green (kernel tests; add --generate for a SmolLM2 generation under ASan too)"
    exit 0
fi
echo "==> a short generation under AddressSanitizer"
cargo +nightly build -q --bin infer --target "$host"
bin=target/asan/$host/debug/infer
home=${INFER_HOME:-$HOME/.cache/infer}
model=$home/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
    echo "error: $model is missing (infer pull smollm2)" >&2
    exit 1
fi
for isa in "${levels[@]}"; do
    out=$(INFER_ISA=$isa "$bin" run "$model" -p "The capital of France is" -n 8 --temp 0 -c 256 2>&1) || {
        echo "error: infer run failed under AddressSanitizer at INFER_ISA=$isa:" >&2
        echo "$out" >&2
        exit 1
    }
    echo "--> INFER_ISA=$isa: $(echo "$out" | head -1 | cut -c1-100)"
done
echo "sanitizer runs: green"
