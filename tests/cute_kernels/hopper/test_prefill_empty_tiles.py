"""Queries that see no key (more queries than [prefix ; new keys], or no key at all): every implementation
refuses the shape with one ValueError (cute_kernels.attention_args.check_queries_see_keys), the host once
per step when the step's plan checked it; and the kernel, fed such a tile anyway, writes O = 0 and
LSE = -inf instead of waiting for stages no one fills (GPU test)."""
import pytest
import torch

import cute_kernels.hopper.prefill.prefill_host as host
from cute_kernels.attention_args import PrefillArgs
from cute_kernels.hopper.prefill.prefill_host import plan_prefill, prepare_prefill_args
from cute_kernels.reference import prefill_attention_ref
from tests.cute_kernels.hopper.test_prefill_attention import gpu, make_batch

UNSEEING = [  # (q_lens, k_lens, prefix_lens, causal): a causal chunk longer than its keys; a sequence with no key
    ([40, 5], [40, 3], [0, 0], True),
    ([4, 6], [4, 0], [0, 0], False),
    ([30], [10], [8], True),
]


def args_of(q_lens, k_lens, prefix_lens, causal, dtype=torch.bfloat16, device="cpu", **kw) -> PrefillArgs:
    x = make_batch(q_lens, prefix_lens, 8, 2, d=64, dtype=dtype, device=device, k_lens=k_lens)
    return PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.125, causal, x["k_cache"],
                       x["v_cache"], x["block_tables"], x["prefix_lens"], **kw)


@pytest.mark.parametrize("q_lens,k_lens,prefix_lens,causal", UNSEEING)
def test_the_host_and_the_reference_refuse_queries_without_keys(q_lens, k_lens, prefix_lens, causal):
    args = args_of(q_lens, k_lens, prefix_lens, causal)
    with pytest.raises(ValueError, match=r"sequence \d has \d+ queries but \d+ keys"):
        prepare_prefill_args(args)
    with pytest.raises(ValueError, match="would see no key"):
        prefill_attention_ref(args)
    with pytest.raises(ValueError, match="would see no key"):  # once per step, when the plan is made
        plan_prefill(args.prefix_lens, args.block_tables, args.k_cache.shape[0], args.cu_seqlens_q, args.cu_seqlens_k)


def test_a_checked_plan_spares_the_per_layer_check(monkeypatch):
    args = args_of([7, 3], [7, 3], [16, 0], True)
    plan = plan_prefill(args.prefix_lens, args.block_tables, args.k_cache.shape[0], args.cu_seqlens_q,
                        args.cu_seqlens_k)
    assert plan.lengths_checked and not plan_prefill(args.prefix_lens, args.block_tables, 99).lengths_checked
    calls = []
    monkeypatch.setattr(host, "check_queries_see_keys", lambda *a: calls.append(a))
    prepare_prefill_args(PrefillArgs(**{**args.__dict__, "plan": plan}))
    assert calls == []
    prepare_prefill_args(args)
    assert len(calls) == 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("q_lens,k_lens,prefix_lens,causal", UNSEEING)
def test_the_kernel_writes_zero_and_minus_inf_where_no_key_is_seen_gpu(q_lens, k_lens, prefix_lens, causal,
                                                                         monkeypatch):
    from cute_kernels.hopper.prefill.prefill_launch import launch_prefill

    monkeypatch.setattr(host, "check_queries_see_keys", lambda *a: None)  # feed the kernel what the host refuses
    launch = prepare_prefill_args(args_of(q_lens, k_lens, prefix_lens, causal, device="cuda"))
    launch.out.fill_(float("nan"))
    launch.lse.fill_(float("nan"))
    launch_prefill(launch)
    torch.cuda.synchronize()  # a tile waiting for stages no one fills would hang here
    seen = prefix_lens[0] + k_lens[0] if causal else None
    rows = slice(0, q_lens[0] - seen) if causal else slice(q_lens[0], q_lens[0] + q_lens[1])
    assert torch.equal(launch.out[rows].float(), torch.zeros_like(launch.out[rows].float()))
    assert torch.isneginf(launch.lse[rows]).all()
    assert not launch.out.isnan().any() and not launch.lse.isnan().any()
