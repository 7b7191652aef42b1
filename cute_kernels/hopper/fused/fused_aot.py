"""Run the ahead-of-time exported fused elementwise kernels WITHOUT the DSL (C ABI:
toolchain/csrc/fused_ops_aot.h): the args struct and the launch; opening the library is aot_library.py."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from cute_kernels.toolchain.aot_library import AotLibrary, current_stream, get_library

from .fused_host import FusedLaunch


class MatrixC(ctypes.Structure):
    """Mirror of cute_aot_matrix_t."""

    _fields_ = [("data", ctypes.c_void_p), ("rows", ctypes.c_int32), ("cols", ctypes.c_int32),
                ("row_stride", ctypes.c_int64)]


class FusedOpsArgsC(ctypes.Structure):
    """Mirror of cute_aot_fused_ops_args_t."""

    _fields_ = [("m", MatrixC * 5), ("slots", ctypes.c_void_p), ("num_slots", ctypes.c_int32),
                ("scalar", ctypes.c_float)]


def fused_c_args(launch: FusedLaunch) -> FusedOpsArgsC:
    """The C struct of a FusedLaunch (whose layouts fused_host already checked)."""
    matrices = (MatrixC * 5)(*(MatrixC(t.data_ptr(), t.shape[0], t.shape[1], t.stride(0)) for t in launch.matrices))
    return FusedOpsArgsC(matrices, launch.slots.data_ptr(), launch.slots.shape[0], launch.scalar)


class AotFusedOps(AotLibrary):
    family = "fused_ops"

    def __init__(self, path: Path, manifest: dict, lib: Any = None):
        super().__init__(path, manifest, lib)
        self.check_args_size("cute_aot_fused_ops_args_size", FusedOpsArgsC)

    def launch(self, launch: FusedLaunch, stream: int) -> None:
        self.launch_struct(launch.spec.name, fused_c_args(launch), stream)


def launch_fused_aot(launch: FusedLaunch) -> None:
    """Launch on the operands' device and torch's current stream there."""
    import torch

    device = launch.matrices[0].device
    with torch.cuda.device(device):
        get_library(AotFusedOps).launch(launch, current_stream(device))
