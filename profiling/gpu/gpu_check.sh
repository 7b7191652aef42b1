# Sourced by nsys.sh and ncu.sh: stop with a one-line reason (exit 2) unless an NVIDIA GPU, a CUDA
# build of torch that sees it, and the named profiler are all here.
need_gpu_and() {
  local tool="$1"
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "$(basename "$0"): no NVIDIA GPU here (nvidia-smi lists none); run it on a GPU machine" >&2; exit 2
  fi
  if ! python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "$(basename "$0"): torch sees no CUDA device (a CPU build of torch?)" >&2; exit 2
  fi
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$(basename "$0"): $tool not found on PATH (install NVIDIA Nsight: it ships with the CUDA toolkit)" >&2; exit 2
  fi
}
