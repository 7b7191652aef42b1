#!/usr/bin/env bash
# The one prepared GPU command: every GPU smoke, test and kernel benchmark, under 6 minutes, one table.
# `bash profiling/gpu/gpu_suite.sh --help` says what it does and prints the command a lent GPU runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=python3                        # the GPU image's interpreter (it may have no `python`)
CARRY=(build/aot)                 # ignored paths a GPU run carries (the AOT kernels; the image lacks the DSL)
RUN_TIMEOUT_S=420                 # the device run's timeout_s: the budget below plus start, table and tar
BUDGET_S=${GPU_SUITE_BUDGET_S:-330}  # every step together, preflight to the last benchmark (env: rehearsals)
GPU_COMMAND="bash profiling/gpu/gpu_suite.sh"
LOGS_TAR=gpu_suite_logs.tar.gz    # under $OUT, with gpu_suite_table.txt and gpu_suite_progress.txt (3 files)

# The plan: family, kind, label, timeout (s), command. Smokes first, one family per process in this
# order (a prefill hang cannot hide the others); then each family's GPU tests (pytest -x -m gpu, one
# process per family, the families at once); then the benchmarks one after another (they time).
PLAN=(
  "decode  smoke decode     30 profiling/gpu/gpu_smoke.py --family decode"
  "fused   smoke fused      30 profiling/gpu/gpu_smoke.py --family fused"
  "fp8     smoke fp8        30 profiling/gpu/gpu_smoke.py --family fp8"
  "prefill smoke prefill    30 profiling/gpu/gpu_smoke.py --family prefill"
  "decode  tests decode    120 tests/cute_kernels/hopper/test_decode_attention.py tests/cute_kernels/hopper/test_kv_e4m3.py"
  "fused   tests fused      90 tests/cute_kernels/hopper/test_fused_ops.py"
  "fp8     tests fp8        90 tests/cute_kernels/hopper/test_fp8_gemm.py"
  "prefill tests prefill    90 tests/cute_kernels/hopper/test_prefill_attention.py tests/cute_kernels/hopper/test_prefill_tile_order.py tests/cute_kernels/hopper/test_aot.py"
  "engine  tests engine     90 tests/runtime/accel/test_cuda_graphs.py tests/runtime/accel/test_engine_gpu.py"
  "decode  bench decode     40 profiling/gpu/bench_kernels.py decode"
  "fused   bench fused      25 profiling/gpu/bench_kernels.py fused"
  "fp8     bench fp8        40 profiling/gpu/bench_kernels.py fp8"
  "fp8     bench fp8_engine 30 profiling/gpu/bench_kernels.py fp8_engine"
  "prefill bench prefill    60 profiling/gpu/bench_kernels.py prefill"
  "engine  bench generate   60 profiling/benchmarks/bench_generate.py --device cuda"
)
ENGINE_NEEDS=(decode fused prefill)  # the engine steps are skipped when one of these smokes hung

usage() {
  cat <<EOF
profiling/gpu/gpu_suite.sh: the GPU suite as ONE prepared command for a lent Hopper GPU (sm_90).

  bash profiling/gpu/gpu_suite.sh --prepare   here, once per kernel change: build the AOT kernels into
                                          build/aot from this very tree and record its hash (needs the
                                          DSL and a CUDA 13 toolkit; minutes on 2 cores)
  bash profiling/gpu/gpu_suite.sh --dry-run   here, on the CPU (CI runs it): bash syntax; the GPU image
                                          emulated (gguf, xgrammar, fastapi, uvicorn, gradio, the DSL ...
                                          blocked): every smoke, benchmark and GPU test module imports,
                                          each smoke lists its checks, each benchmark its cases, each
                                          test file collects its GPU tests; build/aot present and fresh;
                                          what travels under 64 MiB; prints the command below
  bash profiling/gpu/gpu_suite.sh             on the GPU: the run itself
  bash profiling/gpu/gpu_suite.sh --list      the plan, one step a line (tests/profiling/test_gpu_image_imports.py reads it)

The command a lent GPU runs (the device tool's run, from the repository root; \$OUT comes back):
  run(command="$GPU_COMMAND", carry=["${CARRY[*]}"], timeout_s=$RUN_TIMEOUT_S)

On the GPU (python3, torch + CUDA; no DSL, no gguf, no network), in ${BUDGET_S} s at most:
  1. preflight: an sm_90 device (else exit 3), and build/aot fresh for this tree and opening here
     (else one FAIL row and stop: nothing is rebuilt there);
  2. the smoke of each kernel family in its own process and timeout: decode, fused, fp8, prefill
     (profiling/gpu/gpu_smoke.py --family NAME: one small launch of each kernel against the reference);
  3. each family's GPU tests, pytest -x, one process per family (a family whose smoke hung is skipped);
  4. the benchmarks (profiling/gpu/bench_kernels.py decode fused fp8 fp8_engine prefill; bench_generate.py
     --device cuda), each under its timeout. A step cut off is a TIMEOUT row; the suite goes on.
  Then one table, per family: smoke (checks ok, kernel calls), worst error against the reference,
  the GPU tests, and the benchmark headline beside its peer (cuDNN SDPA / flash SDPA, torch._scaled_mm,
  the device copy bandwidth, the torch backend). Under \$OUT (at most 3 files): $LOGS_TAR (every log
  and JSON), gpu_suite_table.txt, gpu_suite_progress.txt (a line per finished step, written as it goes).
  TMPDIR and the pytest / torch / triton / DSL caches live in a temp folder outside \$OUT.
EOF
}

list_plan() { for line in "${PLAN[@]}"; do read -r -a f <<< "$line"; echo "${f[*]}"; done; }

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --list) list_plan; exit 0 ;;
  --prepare) exec $PY profiling/gpu/gpu_suite_prep.py prepare --out "$ROOT/build/aot" ;;
  --dry-run|"") ;;
  *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
esac

WORK=$(mktemp -d /tmp/gpu_suite.XXXXXX)   # logs, TMPDIR and caches: never under $OUT
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/tmp" "$WORK/cache"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TMPDIR=$WORK/tmp XDG_CACHE_HOME=$WORK/cache TRITON_CACHE_DIR=$WORK/cache/triton
export TORCHINDUCTOR_CACHE_DIR=$WORK/cache/inductor CUDA_CACHE_PATH=$WORK/cache/nv MPLCONFIGDIR=$WORK/cache/mpl
export CUTE_KERNELS_PATH="${CUTE_KERNELS_PATH:-aot}" CUTE_AOT_DIR="${CUTE_AOT_DIR:-$ROOT/build/aot}"

if [[ "${1:-}" == "--dry-run" ]]; then
  trap 'rm -rf "$WORK"' EXIT
  status=0 ready=yes
  say() { printf '%-8s %-48s %s\n' "$1" "$2" "$3"; }
  if bash -n "$0"; then say check gpu_suite.sh "bash syntax ok"; else say check gpu_suite.sh FAIL; status=1; fi
  # the GPU image emulated: imports, smoke checks, bench cases, test collection (one process)
  $PY profiling/gpu/gpu_suite_image.py --json "$WORK/image.json" > "$WORK/image.txt" 2>&1 || status=1
  cat "$WORK/image.txt"
  if aot=$($PY profiling/gpu/gpu_suite_prep.py check-aot "$CUTE_AOT_DIR" 2>&1); then say carry build/aot "$aot"
  else say carry build/aot "NOT READY: $aot"; ready="no: build/aot is missing or stale (bash profiling/gpu/gpu_suite.sh --prepare)"; fi
  carried=(); for c in "${CARRY[@]}"; do [[ -e "$ROOT/$c" ]] && carried+=("$c"); done
  if size=$($PY profiling/gpu/gpu_suite_prep.py travel-size "${carried[@]}" 2>&1); then say size travels "$size"
  else say size travels "$size"; status=1; fi
  (( status == 0 )) || ready="no: the checks above failed"
  echo "== gpu_suite dry run: $( (( status == 0 )) && echo ok || echo FAIL ); ready for a GPU run: $ready"
  echo "GPU command: run(command=\"$GPU_COMMAND\", carry=[\"${CARRY[*]}\"], timeout_s=$RUN_TIMEOUT_S)"
  exit $status
fi

# ------------------------------------------------------------------------------------ the GPU run
OUT="${OUT:-$(mktemp -d /tmp/gpu_suite_out.XXXXXX)}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
case "$(cd "$WORK" && pwd -P)/" in "$OUT"/*) echo "FAIL: the work folder $WORK is under \$OUT" >&2; exit 2 ;; esac
STEPS=$LOGS/steps.tsv
PROGRESS=$OUT/gpu_suite_progress.txt
: > "$STEPS"; : > "$PROGRESS"
declare -A HUNG=()

finish() {  # the table (stdout and $OUT), every log into one tar under $OUT; the table's verdict
  $PY profiling/gpu/gpu_suite_report.py table "$LOGS" --out "$OUT/gpu_suite_table.txt" --seconds "$SECONDS"
  verdict=$?
  (( verdict < 2 )) || cat "$STEPS"
  $PY profiling/gpu/gpu_suite_report.py pack "$LOGS" "$OUT/$LOGS_TAR" || tar -czf "$OUT/$LOGS_TAR" -C "$WORK" logs
  rm -rf "$WORK"
}
trap 'finish; exit 130' INT TERM

record() {  # family kind label rc seconds limit: one line in steps.tsv and in the progress file
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$STEPS"
  local what
  case $4 in skip*) what=$4 ;; 0) what=ok ;; 124|137) what="TIMEOUT at $6 s" ;; *) what="exit $4" ;; esac
  printf '%-4s %-8s %-9s %-11s %s (%s s)\n' "$SECONDS" "$1" "$2" "$3" "$what" "$5" | tee -a "$PROGRESS"
}

run_step() {  # family kind label cap command...: under min(cap, what is left of the budget)
  local fam=$1 kind=$2 label=$3 cap=$4; shift 4
  local left=$(( BUDGET_S - SECONDS )) start=$SECONDS log="$LOGS/${kind}_${label}.log" json=()
  local limit=$(( cap < left ? cap : left ))
  if (( limit < 8 )); then record "$fam" "$kind" "$label" "skipped: the ${BUDGET_S} s budget is spent" 0 0; return; fi
  if [[ $kind == tests ]]; then set -- pytest "$@"; else json=(--json "$LOGS/${kind}_${label}.json"); fi
  timeout -k 5 "$limit" $PY profiling/gpu/gpu_suite_step.py "$limit" "$@" "${json[@]}" > "$log" 2>&1
  local rc=$?
  (( rc == 124 || rc == 137 )) && [[ $kind == smoke ]] && HUNG[$fam]=1
  record "$fam" "$kind" "$label" "$rc" $(( SECONDS - start )) "$limit"
}

# 1. preflight: the device, then the carried kernels (checked, never rebuilt: the DSL is not here)
device=$(timeout 60 $PY -c 'import sys, torch
if not torch.cuda.is_available(): sys.exit(1)
print("sm_%d%d" % torch.cuda.get_device_capability(), torch.cuda.get_device_name(),
      "(torch %s)" % getattr(torch, "__version__", "?"))' 2> "$LOGS/preflight_device.log") \
  || { echo "no CUDA device" | tee -a "$LOGS/preflight_device.log" >&2; record all preflight device 2 "$SECONDS" 60; finish; exit 2; }
echo "$device" >> "$LOGS/preflight_device.log"
if [[ "${device%% *}" != sm_90 ]]; then
  echo "FAIL: the device is ${device%% *} (${device#* }); the kernels and their GPU tests need sm_90" \
    | tee -a "$LOGS/preflight_device.log" >&2
  record all preflight device 3 "$SECONDS" 60; finish; exit 3
fi
record all preflight device 0 "$SECONDS" 60
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOGS/preflight_device.log" 2>/dev/null
if [[ "$CUTE_KERNELS_PATH" == aot ]]; then  # fresh for this tree and opening here, or one FAIL row
  timeout 60 $PY profiling/gpu/gpu_suite_prep.py check-aot "$CUTE_AOT_DIR" > "$LOGS/preflight_kernels.log" 2>&1
else
  timeout 60 $PY -c 'import cutlass; print("jit: nvidia-cutlass-dsl", cutlass.__version__)' > "$LOGS/preflight_kernels.log" 2>&1
fi
rc=$?
record all preflight kernels "$rc" "$SECONDS" 60
if (( rc != 0 )); then finish; exit 1; fi

# 2-4. smokes (in order, each alone), the families' tests (at once), the benchmarks (one at a time)
for line in "${PLAN[@]}"; do
  read -r fam kind label cap cmd <<< "$line"
  [[ $kind == smoke ]] && run_step "$fam" "$kind" "$label" "$cap" $cmd
done
skip_reason() {  # family: why its tests and benchmarks cannot run, or nothing
  local deps=("$1"); [[ $1 == engine ]] && deps=("${ENGINE_NEEDS[@]}")
  for d in "${deps[@]}"; do [[ -n "${HUNG[$d]:-}" ]] && { echo "skipped: the $d smoke hung"; return; }; done
}
for line in "${PLAN[@]}"; do
  read -r fam kind label cap cmd <<< "$line"
  [[ $kind == tests ]] || continue
  if why=$(skip_reason "$fam") && [[ -n "$why" ]]; then record "$fam" tests "$label" "$why" 0 0; continue; fi
  run_step "$fam" tests "$label" "$cap" $cmd &
done
wait
for line in "${PLAN[@]}"; do
  read -r fam kind label cap cmd <<< "$line"
  [[ $kind == bench ]] || continue
  if why=$(skip_reason "$fam") && [[ -n "$why" ]]; then record "$fam" bench "$label" "$why" 0 0; continue; fi
  run_step "$fam" bench "$label" "$cap" $cmd
done

finish
exit $(( verdict == 0 ? 0 : 1 ))
