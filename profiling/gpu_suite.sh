#!/usr/bin/env bash
# One command for every GPU numerics test and kernel benchmark, ending in one compact table.
#   profiling/gpu_suite.sh            run on a Hopper GPU (torch + CUDA; the DSL is NOT needed)
#   profiling/gpu_suite.sh --dry-run  CPU/CI: check this script, that the tests collect, list the bench
#                                     cases, and build + open one AOT variant (when the DSL is here)
# Kernels run ahead-of-time compiled (CUTE_KERNELS_PATH=aot by default): build them where the DSL is,
#   python -m cute_kernels.aot --all --out build/aot  (every variant the GPU tests launch, non-causal too;
#                                                      a few minutes on 2 cores, a few MB)
# and carry build/aot to the GPU box (or point CUTE_AOT_DIR at them). Where the DSL is installed and
# build/aot is missing or stale, this script builds it first. CUTE_KERNELS_PATH=jit uses the DSL's JIT.
# Order: a one-minute smoke (profiling/gpu_smoke.py: the library opens, one small launch of each kernel
# family matches its reference) that stops the suite on failure; then TESTS, BENCHES and GENERATE, each
# under what is left of an 8-minute budget. The suite FAILS (not skips) on a device that is not sm_90.
# Later kernels add a line to TESTS and BENCHES.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${OUT:-}" ]]; then OUT="$(mktemp -d)"; [[ "${1:-}" == "--dry-run" ]] && trap 'rm -rf "$OUT"' EXIT; fi
export TMPDIR="${TMPDIR:-$OUT}"   # the DSL's cache stays with this run
export CUTE_KERNELS_PATH="${CUTE_KERNELS_PATH:-aot}"
export CUTE_AOT_DIR="${CUTE_AOT_DIR:-$PWD/build/aot}"

TESTS=(tests/test_prefill_attention.py tests/test_prefill_tile_order.py tests/test_aot.py  # GPU numerics (marker: gpu)
       tests/test_decode_attention.py tests/test_fused_ops.py tests/test_cuda_graphs.py tests/test_engine_gpu.py
       tests/test_fp8_gemm.py)
BENCHES=(prefill decode fused fp8 fp8_engine)               # profiling/bench_kernels.py <name>
GENERATE=(profiling/bench_generate.py --device cuda)        # the engine on an 8B-shaped random model
BUDGET_S=470                                                # the whole suite, smoke included (< 8 min)

DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1

status=0
rows=()
row() { rows+=("$(printf '%-10s %-34s %s' "$1" "$2" "$3")"); }
have_dsl() { python -c 'import cutlass' 2>/dev/null; }
# run a step under what is left of the budget; a step that cannot start or is cut off fails the suite
budgeted() { local left=$(( BUDGET_S - SECONDS )); (( left > 5 )) || return 124; timeout "$left" "$@"; }
aot_status() { python -m cute_kernels.aot --status --out "$1" 2>&1 | tail -n 1; }

if (( DRY )); then
  bash -n "$0" && row check gpu_suite.sh "syntax ok" || { row check gpu_suite.sh FAIL; status=1; }
  python -m pytest -q --collect-only -m gpu "${TESTS[@]}" > "$OUT/collect.txt" 2>/dev/null  # one start for all
  for t in "${TESTS[@]}"; do
    n=$(grep -c "^$t::" "$OUT/collect.txt") || true
    if (( n > 0 )); then row tests "$t" "$n gpu tests collect"; else row tests "$t" "FAIL: none collected"; status=1; fi
  done
  for b in "${BENCHES[@]}"; do
    if python profiling/bench_kernels.py "$b" --dry-run > "$OUT/bench_$b.txt"; then
      row bench "$b" "$(wc -l < "$OUT/bench_$b.txt") cases (dry run)"
    else row bench "$b" FAIL; status=1; fi
  done
  if python "${GENERATE[@]}" --dry-run > "$OUT/generate.txt"; then
    row bench generate "$(wc -l < "$OUT/generate.txt") cases (dry run)"
  else row bench generate FAIL; status=1; fi
  if smoke=$(python profiling/gpu_smoke.py --dry-run 2>&1); then row smoke gpu_smoke.py "$smoke"
  else row smoke gpu_smoke.py "FAIL: $smoke"; status=1; fi
  if have_dsl; then
    if python -m cute_kernels.aot --out "$OUT/aot" --only bfloat16_d128_g4 > "$OUT/aot.txt" 2>&1; then
      row aot "build + open (1 variant)" "$(aot_status "$OUT/aot")"
    else row aot "build (1 variant)" "FAIL: $(tail -n 1 "$OUT/aot.txt")"; status=1; fi
  else row aot "build (1 variant)" "skipped: nvidia-cutlass-dsl not installed"; fi
else
  python -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "no CUDA device" >&2; exit 2; }
  arch=$(python -c 'import torch; print("sm_%d%d" % torch.cuda.get_device_capability())')
  [[ "$arch" == sm_90 ]] || { echo "FAIL: the device is $arch ($(python -c 'import torch; print(torch.cuda.get_device_name())')); the kernels and their GPU tests need sm_90" >&2; exit 3; }
  if [[ "$CUTE_KERNELS_PATH" == aot ]]; then
    if have_dsl && ! python -m cute_kernels.aot --status --out "$CUTE_AOT_DIR" > /dev/null 2>&1; then
      python -m cute_kernels.aot --all --out "$CUTE_AOT_DIR" > "$OUT/aot_build.txt" 2>&1 || row aot build "FAIL: see $OUT/aot_build.txt"
    fi
    aot_line=$(aot_status "$CUTE_AOT_DIR")
    [[ "$aot_line" == *"opens here"* ]] || status=1
    row kernels aot "$aot_line"
  else
    if have_dsl; then row kernels jit "nvidia-cutlass-dsl installed"
    else row kernels jit "FAIL: nvidia-cutlass-dsl missing"; status=1; fi
  fi
  if timeout 60 python profiling/gpu_smoke.py > "$OUT/smoke.txt" 2>&1; then
    while IFS= read -r line; do row smoke gpu_smoke.py "$line"; done < "$OUT/smoke.txt"
  else
    while IFS= read -r line; do row smoke gpu_smoke.py "$line"; done < <(tail -n 3 "$OUT/smoke.txt")
    row smoke gpu_smoke.py "FAIL: stopping here (logs in $OUT)"; status=1
    printf '%s\n' "${rows[@]}"; exit $status
  fi
  for t in "${TESTS[@]}"; do
    budgeted python -m pytest -q -m gpu "$t" -p no:cacheprovider > "$OUT/test_$(basename "$t" .py).txt" 2>&1
    rc=$?
    summary=$(tail -n 1 "$OUT/test_$(basename "$t" .py).txt")
    (( rc == 124 )) && summary="FAIL: cut off by the suite's ${BUDGET_S} s budget"
    (( rc == 0 )) || status=1
    row tests "$t" "$summary"
  done
  for b in "${BENCHES[@]}"; do
    budgeted python profiling/bench_kernels.py "$b" --json "$OUT/bench_$b.json" > "$OUT/bench_$b.txt" 2>&1 || status=1
    while IFS= read -r line; do row bench "$b" "$line"; done < "$OUT/bench_$b.txt"
  done
  budgeted python "${GENERATE[@]}" --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1 || status=1
  while IFS= read -r line; do row bench generate "$line"; done < <(tail -n 6 "$OUT/generate.txt")
fi

if (( DRY )); then echo "== gpu_suite (dry run)"; else echo "== gpu_suite ($CUTE_KERNELS_PATH kernels, ${SECONDS} s): logs in $OUT"; fi
printf '%s\n' "${rows[@]}"
exit $status
