#!/usr/bin/env bash
# Nsight Compute on one kernel of the engine workload (profiling/common/engine_workload.py), by name, with the
# clocks left as they run (--clock-control none) and the sections that matter for the kind of kernel:
#   decode         memory throughput (SpeedOfLight, MemoryWorkloadAnalysis): a decode kernel is bandwidth-bound
#   prefill, gemm  tensor-pipe utilisation (SpeedOfLight, ComputeWorkloadAnalysis): they should be compute-bound
#   profiling/gpu/ncu.sh KERNEL_NAME_REGEX {decode|prefill|gemm} [engine_workload.py args]
# Prints where the report went and its headline numbers. OUT=dir picks the folder (default profiling/out).
# Without an NVIDIA GPU or ncu: exit 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
kernel="${1:-}" kind="${2:-}"
if [[ -z "$kernel" || ! "$kind" =~ ^(decode|prefill|gemm)$ ]]; then
  echo "usage: profiling/gpu/ncu.sh KERNEL_NAME_REGEX {decode|prefill|gemm} [engine_workload.py args]" >&2; exit 2
fi
shift 2
source profiling/gpu/gpu_check.sh
need_gpu_and ncu
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUTE_KERNELS_PATH="${CUTE_KERNELS_PATH:-aot}" CUTE_AOT_DIR="${CUTE_AOT_DIR:-$PWD/build/aot}"  # as gpu_suite.sh
if [[ "$kind" == decode ]]; then
  sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis)
  headline='Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate'
else
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis)
  headline='Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc Active|SM Busy'
fi
OUT="${OUT:-profiling/out}"
mkdir -p "$OUT"
report="$OUT/ncu_${kind}_$(echo "$kernel" | tr -c 'A-Za-z0-9_' _)"
ncu --kernel-name "regex:$kernel" --launch-count 1 --clock-control none --profile-from-start off "${sections[@]}" \
  --force-overwrite -o "$report" python profiling/common/engine_workload.py --cuda-profiler-range "$@" || exit 1
if [[ ! -f "$report.ncu-rep" ]]; then
  echo "ncu.sh: no kernel matched regex:$kernel (nsys.sh lists the kernels by name)" >&2; exit 1
fi
echo "report: $report.ncu-rep (open in ncu-ui)"
ncu --import "$report.ncu-rep" --page details | grep -E "^\s*\S.*($headline)" | head -n 12
if [[ "$kind" != decode ]]; then  # the tensor pipes' share of peak, from the metrics the section collected
  ncu --import "$report.ncu-rep" --page raw | grep -iE 'pipe_tensor.*pct_of_peak' | head -n 6
fi
