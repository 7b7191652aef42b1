#!/usr/bin/env bash
# An Nsight Systems timeline of a short fixed engine workload (profiling/common/engine_workload.py: 8 requests,
# 32 tokens each, after a warm-up left out of the capture), with the engine's NVTX ranges (schedule,
# prepare, attention, mlp, sample, output). Prints where the report went and its headline numbers:
# the NVTX ranges and the GPU kernels by total time.
#   profiling/gpu/nsys.sh [engine_workload.py args, e.g. --requests 16 --max-tokens 64]
# OUT=dir picks the report folder (default profiling/out). Without an NVIDIA GPU or nsys: exit 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
source profiling/gpu/gpu_check.sh
need_gpu_and nsys
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUTE_KERNELS_PATH="${CUTE_KERNELS_PATH:-aot}" CUTE_AOT_DIR="${CUTE_AOT_DIR:-$PWD/build/aot}"  # as gpu_suite.sh
OUT="${OUT:-profiling/out}"
mkdir -p "$OUT"
report="$OUT/engine_timeline"
nsys profile --trace=cuda,nvtx,osrt --sample=none --capture-range=cudaProfilerApi --capture-range-end=stop \
  --force-overwrite=true -o "$report" python profiling/common/engine_workload.py --cuda-profiler-range "$@" || exit 1
echo "report: $report.nsys-rep (open in nsys-ui)"
nsys stats --report nvtx_sum --report cuda_gpu_kern_sum --format table "$report.nsys-rep" 2>/dev/null \
  | grep -v '^\s*$' | head -n 40
