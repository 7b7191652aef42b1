"""Decode GEMV speed of the K-quant kernels (csrc/cpu_kquant_gemm.c) and of Q5_0/Q5_1 against Q4_1
(csrc/cpu_quant_gemm.c) on the same weight shape, one activation row, one thread (as decode runs these shapes: under
quant_gemm.PARALLEL_MIN_MACS multiply-adds a product stays on the calling thread).

    python profiling/benchmarks/bench_kquant.py [--shapes 576x1536,1536x768] [--rounds 9] [--calls 300]

A shape is N x K (output rows x input columns); K-quant rows hold whole 256-value super-blocks, so
K = 576 (SmolLM2-135M's hidden size; llama.cpp stores such tensors in Q5_0/Q8_0 even in a Q4_K_M
file) cannot be one: 1536x768 stands in for 1536x576. Each round times `calls` kernel calls per type,
the types interleaved within a round so machine load hits them alike; the median round is printed,
with the ratio to Q4_1 (above 1: slower than Q4_1) and the weight bytes read per microsecond.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from cute_kernels.cpu import quant_gemm as qg  # noqa: E402
from cute_kernels.cpu.quant_blocks import QK, block_values, row_bytes  # noqa: E402

TYPES = ("Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def random_blocks(type_name: str, n: int, k: int) -> torch.Tensor:
    """Random bytes with small finite fp16 scales: the kernels' speed does not depend on the values."""
    values = block_values(type_name)
    blocks = torch.randint(0, 256, (n * k // values, row_bytes(type_name, values)), dtype=torch.uint8)
    for at in (208,) if type_name == "Q6_K" else (0, 2):  # d (and the min, dmin, or Q5_0's qh) of every block
        blocks[:, at:at + 2] = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    return blocks.reshape(n, -1).contiguous()


def timer(type_name: str, n: int, k: int, calls: int):
    """A closure timing `calls` GEMVs of one row against a random n x k weight of type_name."""
    blocks = random_blocks(type_name, n, k)
    x = torch.randn(1, k)
    q, d, s = torch.empty(1, k, dtype=torch.int8), torch.empty(1, k // QK), torch.empty(1, k // QK)
    qg._library()[0].quantize_rows_q8(x.data_ptr(), 1, k, q.data_ptr(), d.data_ptr(), s.data_ptr(), 1)
    gemm, _, type_id = qg._gemm_and_dequantize(type_name)
    y = torch.empty(1, n)
    held = (blocks, q, d, s, y)  # the kernel gets raw pointers: the closure keeps their tensors alive
    args = (blocks.data_ptr(), type_id, q.data_ptr(), d.data_ptr(), s.data_ptr(), None, y.data_ptr(), 1, n, k, 1)

    def run() -> float:
        assert held
        start = time.perf_counter()
        for _ in range(calls):
            gemm(*args)
        return (time.perf_counter() - start) / calls

    return run, blocks.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="576x1536,1536x768")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"isa {qg.isa()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        timers = {t: timer(t, n, k, args.calls) for t in TYPES if k % block_values(t) == 0}
        times = {t: [] for t in timers}
        for _ in range(args.rounds):
            for t, (run, _) in timers.items():
                times[t].append(run())
        base = statistics.median(times["Q4_1"])
        for t, (_, nbytes) in timers.items():
            med = statistics.median(times[t])
            print(f"{n}x{k} {t}: {med * 1e6:7.1f} us  x{med / base:.2f} of Q4_1  "
                  f"{nbytes / (med * 1e6):6.0f} weight bytes/us")


if __name__ == "__main__":
    main()
