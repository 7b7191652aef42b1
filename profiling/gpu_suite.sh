#!/usr/bin/env bash
# One command for every GPU numerics test and kernel benchmark, ending in one compact table.
#   profiling/gpu_suite.sh            run on a Hopper GPU (needs torch+CUDA and nvidia-cutlass-dsl)
#   profiling/gpu_suite.sh --dry-run  CPU/CI: check this script, that the tests collect, list the bench cases
# Later kernels add a line to TESTS and BENCHES.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${OUT:-}" ]]; then OUT="$(mktemp -d)"; [[ "${1:-}" == "--dry-run" ]] && trap 'rm -rf "$OUT"' EXIT; fi
export TMPDIR="${TMPDIR:-$OUT}"   # the DSL's cache stays with this run

TESTS=(tests/test_prefill_attention.py)   # GPU numerics (pytest marker: gpu)
BENCHES=(prefill)                         # profiling/bench_kernels.py <name>

DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1

status=0
rows=()
row() { rows+=("$(printf '%-10s %-34s %s' "$1" "$2" "$3")"); }

if (( DRY )); then
  bash -n "$0" && row check gpu_suite.sh "syntax ok" || { row check gpu_suite.sh FAIL; status=1; }
  for t in "${TESTS[@]}"; do
    n=$(python -m pytest -q --collect-only -m gpu "$t" 2>/dev/null | grep -c '::') || true
    if (( n > 0 )); then row tests "$t" "$n gpu tests collect"; else row tests "$t" "FAIL: none collected"; status=1; fi
  done
  for b in "${BENCHES[@]}"; do
    if python profiling/bench_kernels.py "$b" --dry-run > "$OUT/bench_$b.txt"; then
      row bench "$b" "$(wc -l < "$OUT/bench_$b.txt") cases (dry run)"
    else row bench "$b" FAIL; status=1; fi
  done
else
  python -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "no CUDA device" >&2; exit 2; }
  python -c 'import cutlass' 2>/dev/null || row env cutlass "nvidia-cutlass-dsl missing: kernels cannot compile here"
  for t in "${TESTS[@]}"; do
    python -m pytest -q -m gpu "$t" -p no:cacheprovider > "$OUT/test_$(basename "$t" .py).txt" 2>&1
    rc=$?
    summary=$(tail -n 1 "$OUT/test_$(basename "$t" .py).txt")
    (( rc == 0 )) || status=1
    row tests "$t" "$summary"
  done
  for b in "${BENCHES[@]}"; do
    python profiling/bench_kernels.py "$b" --json "$OUT/bench_$b.json" > "$OUT/bench_$b.txt" 2>&1 || status=1
    while IFS= read -r line; do row bench "$b" "$line"; done < "$OUT/bench_$b.txt"
  done
fi

if (( DRY )); then echo "== gpu_suite (dry run)"; else echo "== gpu_suite: logs in $OUT"; fi
printf '%s\n' "${rows[@]}"
exit $status
