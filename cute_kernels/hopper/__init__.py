"""Hopper (sm_90a) kernels in the CuTe DSL, each beside its host code: spec (compile key), schedule
(index arithmetic shared with the CPU tests), kernel, compile, host argument preparation, launch."""
