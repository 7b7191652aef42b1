"""A protocol model of the Hopper kernels' warp-specialized pipelines (pure Python: no DSL, no GPU).

Each kernel's producer, consumer warps, epilogue and copy engines are small state machines (Python
generators of ops.py operations) driven by the same per-tile schedule functions the kernel calls
(hopper/decode/decode_schedule.py, fp8_gemm_schedule.py, prefill_schedule.py) and by dsl.py's model of the
DSL's pipeline helpers. engine.run executes one CTA under a seeded random interleaving with copies
landing in random order, and raises engine.ProtocolError on a deadlock, a stage refilled while read,
a read of the wrong ring position or phase, a missing proxy fence, or copies outliving the CTA.

Modules: engine (mbarriers, named barriers, slots, the scheduler), ops (the operations), dsl (the DSL
helpers), decode / fp8_gemm / prefill (one model per kernel). Kept here beside the other kernel tools
(the compile check, tma_lint) rather than under tests/: it is importable without pytest or the DSL,
so a longer sweep or another check can reuse it; tests/cute_kernels/hopper/test_kernel_protocol.py picks the shapes and
the broken variants.
"""
