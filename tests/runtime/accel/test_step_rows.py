"""Decode rows keep their bits whatever prefill rows share the step, and under --deterministic whatever shares
it (runtime/model/step_rows.py), also where rows take a route that rounds otherwise (the AMX tiles, emulated
here so that every host runs this)."""
import pytest
import torch

from cute_kernels.cpu import fused_ops, quant_gemm, row_groups
from runtime.accel.block_linear import BlockQuantLinear
from runtime.accel.cpu_backend import CpuBackend
from runtime.build import make_runner
from runtime.model.step_rows import decode_rows
from runtime.sequence import SeqChunk
from tests.amx_emulation import emulate_amx, emulated_amx_linear
from tests.cute_kernels.cpu.test_cpu_quant_gemm import gguf_blocks
from tests.tiny_engine import tiny_weights


@pytest.fixture
def amx(monkeypatch):
    linear = BlockQuantLinear("Q4_1", gguf_blocks(torch.randn(96, 64, generator=torch.Generator().manual_seed(0)), "Q4_1"))
    if linear.type_name not in row_groups.GROUPED.values():
        pytest.skip(f"this build keeps the file's layout ({quant_gemm.isa()}), which the AMX route does not read")
    emulate_amx(monkeypatch)
    return linear


def test_decode_rows_choose_their_route_by_their_own_count(amx):
    """Decode rows take the route of their own count, whatever prefill rows share the call: 8 of them the
    lone-row int8 route beside 40 prefill rows on the tiles, 48 the tiles; --deterministic (allow_dequant off) keeps
    every row on the int8 routes at any count."""
    x = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([amx(x[i:i + 1]) for i in range(8)])
    with decode_rows(8):
        mixed = amx(x)  # 8 decode rows beside 40 prefill rows: those take the tiles
        short = amx(x[:30])  # beside 22: fewer than AMX_MIN_ROWS, the int8 GEMM
    assert torch.equal(mixed[:8], alone) and torch.equal(short[:8], alone)
    assert torch.equal(mixed[8:], emulated_amx_linear(x[8:], amx.blocks, amx.type_name, None, 1))
    assert torch.equal(short[8:], amx(x[8:30]))
    by_count = emulated_amx_linear(x, amx.blocks, amx.type_name, None, 1)
    assert torch.equal(amx(x), by_count)  # no step: by count
    assert not torch.equal(by_count[:8], alone)  # the emulated tiles do round otherwise
    with decode_rows(48):
        assert torch.equal(amx(x), by_count)
        amx.allow_dequant = False
        assert torch.equal(amx(x)[:8], alone)


def verify_and_prefill(deterministic: bool):
    """A q4 runner (a vocabulary of whole 8-row groups, so the LM head could take the tiles too), 8 chunks of 5
    tokens to verify (all sampled: decode rows, 40 in all, past AMX_MIN_ROWS) and a 33-token prefill chunk."""
    cfg, tensors = tiny_weights(vocab_size=264)
    runner, _ = make_runner(cfg, tensors, 4 << 20, backend="torch", quantization="q4", deterministic=deterministic)
    g = torch.Generator().manual_seed(2)
    verify = [SeqChunk(torch.randint(0, 200, (5,), generator=g).tolist(), 0, [i], num_logits=5) for i in range(8)]
    prefill = SeqChunk(torch.randint(0, 200, (33,), generator=g).tolist(), 0, [8, 9, 10], num_logits=1)
    return runner, verify, prefill


def test_a_verify_chunks_logits_do_not_depend_on_the_prefill_beside_it(amx):
    """The 40 verify rows take the tiles by their count, with or without a prefill chunk in their step."""
    runner, verify, prefill = verify_and_prefill(deterministic=False)
    together = runner.run(verify)
    assert torch.equal(runner.run([prefill, *verify])[1:], together)
    assert not torch.equal(together, torch.cat([runner.run([c]) for c in verify]))  # alone: 5 rows, the int8 GEMM


def test_under_deterministic_a_verify_chunks_logits_do_not_depend_on_what_shares_its_step(amx):
    """--deterministic: each verify chunk's logits are those it gets alone (greedy speculation = no speculation)."""
    runner, verify, prefill = verify_and_prefill(deterministic=True)
    alone = torch.cat([runner.run([c]) for c in verify])
    assert torch.equal(runner.run(verify), alone)
    assert torch.equal(runner.run([prefill, *verify])[1:], alone)


def test_a_gate_up_pair_joins_silu_where_its_prefill_rows_take_the_tiles(amx):
    """BlockQuantLinear.silu_and_mul (one AMX pass, backend.gated's seam) takes a call whose prefill rows reach the
    tiles, decode rows beside them on their own route, each row the bits of the two ops apart; it declines (None:
    the backend runs the linear, then silu_and_mul) where the prefill rows would not reach the tiles."""
    pair = BlockQuantLinear("Q4_1", gguf_blocks(torch.randn(128, 64, generator=torch.Generator().manual_seed(3)), "Q4_1"))
    x, backend = torch.randn(48, 64, generator=torch.Generator().manual_seed(4)), CpuBackend()
    joined = pair.silu_and_mul(x)
    assert joined is not None and torch.equal(joined, fused_ops.silu_and_mul(pair(x)))
    assert torch.equal(backend.gated(pair, x), joined)
    assert pair.silu_and_mul(x[:20]) is None  # fewer rows than AMX_MIN_ROWS: the int8 tiles
    assert amx.silu_and_mul(x) is None  # 96 rows: a gate half of 48, not whole panels of 32
    alone = torch.cat([fused_ops.silu_and_mul(pair(x[i:i + 1])) for i in range(8)])
    with decode_rows(8):  # 8 decode rows keep the lone-row route, the other 40 take the tiles
        split = pair.silu_and_mul(x)
        assert torch.equal(split, fused_ops.silu_and_mul(pair(x))) and torch.equal(split[:8], alone)
        assert torch.equal(split[8:], joined[8:]) and torch.equal(backend.gated(pair, x), split)
    with decode_rows(20):  # 28 prefill rows: the int8 tiles
        assert pair.silu_and_mul(x) is None
    pair.rows_for_down = True  # hand_glu_rows_to_down: no decode rows, so bf16 rounded as down's AMX input
    handed = pair.silu_and_mul(x)
    assert handed.dtype == torch.bfloat16 and torch.equal(handed, joined.bfloat16())
    with decode_rows(8):
        assert torch.equal(pair.silu_and_mul(x), split)  # decode rows beside: fp32 rows, as before
