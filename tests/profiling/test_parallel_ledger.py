"""docs/parallelism.md's figures come from profiling/parallel_ledger.py: the formulas checked by hand."""
from __future__ import annotations

import argparse

from profiling.parallel_ledger import LLAMA_8B, LLAMA_70B, PLANS, Plan, ledger

ARGS = argparse.Namespace(gpu_gib=80.0, utilization=0.9, activation_gib=2.0, bytes=2, decode_batch=256,
                          prefill_tokens=8192, context=8192)


def test_the_70b_over_two_nodes_by_hand():
    r = ledger(Plan(LLAMA_70B, 8, 2, 1, 2, ""), ARGS)
    assert r["kv_kib_per_token"] == 2 * 40 * 1 * 128 * 2 / 1024  # 40 layers, 1 KV head of 128 per GPU, BF16
    assert r["tp_decode_mib"] == 40 * 2 * (2 * 7 / 8) * 256 * 8192 * 2 / 2**20  # 2 ring all-reduces per layer
    assert r["pp_decode_mib"] == 2 * 256 * 8192 * 2 / 2**20  # hidden states and residual, once per boundary
    assert abs(LLAMA_70B.num_parameters() / 1e9 - 70.55) < 0.01 and abs(LLAMA_8B.num_parameters() / 1e9 - 8.03) < 0.01


def test_every_plan_fits_its_gpus():
    for plan in PLANS:
        r = ledger(plan, ARGS)
        assert 0 < r["weights_gib"] < ARGS.gpu_gib * ARGS.utilization and r["seqs_at_context"] >= 1, plan
        assert (r["tp_decode_mib"] > 0) == (plan.tp > 1)
