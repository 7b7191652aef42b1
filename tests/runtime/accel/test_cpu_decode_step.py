"""The fused CPU decode step (csrc/cpu_decode_step.c, runtime/accel/cpu_decode_step.py) against the
per-layer path it replaces, on tiny random models quantized at load (on every SIMD route this machine
runs: the `cpu_route` fixture) and on the default model.

Tolerance: both paths run the same code per op (quant_dot.h, attention_rows.h, fused_rows.h) on the
same int8 activations, so every integer dot product is identical and only the order of float sums
may differ (the compiler vectorizes each copy of a reduction on its own): ~1e-6 relative per step.
Logits are compared at 1e-4 absolute + 1e-4 relative (values O(1)); a wrong block, head, slot or
position moves them by O(0.1) or more. On these 2-layer models greedy tokens and the KV cache
contents must be identical (compared exactly); over the default model's 30 layers such last-bit
differences can flip int8 roundings and grow, so its test bounds them by the model's own sensitivity.
"""
import dataclasses

import pytest
import torch

from cute_kernels.cpu import build, quant_gemm
from cute_kernels.cpu import decode_step as ds
from cute_kernels.cpu.decode_attention import prepare_tables
from runtime.accel.bf16_linear import Bf16Linear
from runtime.accel.kv_scales import KVScaleSource
from runtime.build import make_runner
from runtime.model.attention_batch import AttentionBatch
from runtime.parallel.layers import RowParallelLinear
from runtime.sequence import SeqChunk
from tests.hf_tiny import our_config, state_dict, tiny_hf_model
from tests.tiny_engine import tiny_weights

TOL = dict(rtol=1e-4, atol=1e-4)
BLOCKS_PER_SEQ = 6


def tiny_runner(quantization: str | None, arch: str = "llama", fused: bool = True, kv_dtype: torch.dtype | None = None,
                weight_dtype: torch.dtype | None = None):
    if arch == "llama":
        cfg, tensors = tiny_weights(arch)
    else:
        hf = tiny_hf_model(arch)
        cfg, tensors = our_config(hf, arch), state_dict(hf)
    calibration = KVScaleSource(list(range(3, 250)))  # read by an int8 / e4m3 cache only
    runner = make_runner(cfg, tensors, 4 << 20, backend="torch", quantization=quantization, kv_dtype=kv_dtype,
                         kv_scale_source=calibration, weight_dtype=weight_dtype)[0]
    if not fused:
        runner.model.decode_step = None
    return runner


def table(seq: int) -> list[int]:
    return list(range(seq * BLOCKS_PER_SEQ, (seq + 1) * BLOCKS_PER_SEQ))


def greedy(runner, prompts: list[list[int]], steps: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill every prompt, then `steps` decode steps of all rows at once: (logits per step, tokens)."""
    tokens = [[int(runner.run([SeqChunk(p, 0, table(i))])[0].argmax())] for i, p in enumerate(prompts)]
    logits = []
    for _ in range(steps):
        chunks = [SeqChunk(t[-1:], len(p) + len(t) - 1, table(i)) for i, (p, t) in enumerate(zip(prompts, tokens))]
        out = runner.run(chunks)
        logits.append(out)
        for t, row in zip(tokens, out):
            t.append(int(row.argmax()))
    return logits, tokens


# contexts 5..62 over 16-token blocks: rows cross block boundaries at different steps
PROMPTS = {1: [[3, 1, 4, 1, 5]], 3: [[3, 1, 4, 1, 5], list(range(40, 55)), list(range(60, 90))]}


@pytest.fixture
def fused_steps(monkeypatch) -> list[int]:
    """Grows by the row count of every step that takes the fused path."""
    calls, run = [], ds.DecodeStepTable.run
    monkeypatch.setattr(ds.DecodeStepTable, "run", lambda self, x, *a: calls.append(x.shape[0]) or run(self, x, *a))
    return calls


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("quantization,arch", [("q4", "llama"), ("int8", "llama"), ("q4", "qwen2")])
def test_fused_step_matches_the_per_layer_path(quantization, arch, rows, fused_steps, cpu_route):
    fused, per_layer = tiny_runner(quantization, arch), tiny_runner(quantization, arch, fused=False)
    got, got_tokens = greedy(fused, PROMPTS[rows], 32)
    assert fused_steps == [rows] * 32
    want, want_tokens = greedy(per_layer, PROMPTS[rows], 32)
    assert len(fused_steps) == 32 and got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    for (k, v), (k2, v2) in zip(fused.kv_caches, per_layer.kv_caches):
        assert torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize("rows", [1, 3])
def test_fused_step_over_bf16_weights_matches_the_per_layer_path(rows, fused_steps, cpu_route):
    """bf16 weights (Bf16Linear): both paths round each linear's input to bf16 and run bf16_dot.h's tiles."""
    fused, per_layer = (tiny_runner(None, weight_dtype=torch.bfloat16, fused=f) for f in (True, False))
    assert fused.model.quantization() == "bf16 x 9"  # 2 layers x 4 linears and the head
    got, got_tokens = greedy(fused, PROMPTS[rows], 32)
    assert fused_steps == [rows] * 32
    want, want_tokens = greedy(per_layer, PROMPTS[rows], 32)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("rows", [1, 3])
def test_fused_step_over_a_bf16_cache_matches_the_per_layer_path(rows, fused_steps, cpu_route):
    """The fused step rounds its K/V rows to bf16 in C (nearest even): the caches must equal the per-layer
    path's torch rounding bit for bit; the outputs then differ by float summation order only (TOL)."""
    fused = tiny_runner("q4", kv_dtype=torch.bfloat16)
    per_layer = tiny_runner("q4", fused=False, kv_dtype=torch.bfloat16)
    got, got_tokens = greedy(fused, PROMPTS[rows], 32)
    assert fused_steps == [rows] * 32
    want, want_tokens = greedy(per_layer, PROMPTS[rows], 32)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    for (k, v), (k2, v2) in zip(fused.kv_caches, per_layer.kv_caches):
        assert k.dtype == torch.bfloat16 and torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_fused_step_over_an_8bit_cache_matches_the_per_layer_path(dtype, fused_steps, cpu_route):
    """The fused step quantizes its K/V rows in C (round(x / scale), nearest even, saturated) and reads them
    back as stored * scale: the caches must equal the per-layer path's torch quantization byte for byte, the
    outputs then differ by float summation order only (TOL)."""
    fused, per_layer = tiny_runner("q4", kv_dtype=dtype), tiny_runner("q4", fused=False, kv_dtype=dtype)
    scales = [layer.kv_scales for layer in fused.model.layers]
    assert all(s is not None and s.k.shape == (2,) for s in scales)
    got, got_tokens = greedy(fused, PROMPTS[3], 12)  # contexts cross a block boundary: 30 -> 42 tokens
    assert fused_steps == [3] * 12
    want, want_tokens = greedy(per_layer, PROMPTS[3], 12)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    for (k, v), (k2, v2) in zip(fused.kv_caches, per_layer.kv_caches):
        assert k.dtype == dtype and torch.equal(k.view(torch.uint8), k2.view(torch.uint8))
        assert torch.equal(v.view(torch.uint8), v2.view(torch.uint8))


def invariant(runner):
    """The runner's bf16 linears batch-invariant (as --deterministic makes them): no AMX tiles at any row count."""
    for linear in runner.model.linears():
        if isinstance(linear, Bf16Linear):
            linear.invariant = True
    return runner


def test_only_decode_only_steps_the_fused_path_serves_take_it(fused_steps):
    """Batch-invariant bf16 weights have neither the tiles GEMM nor the AMX tiles: the step serves as many rows as
    its GEMV does, and no more."""
    runner = invariant(tiny_runner(None, weight_dtype=torch.bfloat16))
    prompts = [[i + 1, i + 2] for i in range(ds.max_rows() + 1)]
    runner.run([SeqChunk(p, 0, table(i)) for i, p in enumerate(prompts)])
    decode = [SeqChunk([7], 2, table(i)) for i in range(len(prompts))]
    runner.run(decode[:ds.max_rows()])
    assert fused_steps == [ds.max_rows()]
    runner.run(decode)  # more rows than the fused step takes
    runner.run(decode[:1] + [SeqChunk([5, 6], 3, table(1))])  # a mixed step
    runner.run([SeqChunk([7, 8], 3, table(0))])  # a verify-style chunk
    assert fused_steps == [ds.max_rows()]


def assert_40_rows_match(make_runner, fused_steps, fused_here: bool) -> None:
    """40 sequences decoding together (contexts 3..25), 4 steps: the fused step (when fused_here, else none)
    matches the per-layer path; tokens and KV caches exact, logits within TOL."""
    prompts = [[3 + i, 1 + i % 7, 4] + list(range(10, 10 + i % 23)) for i in range(40)]
    fused, per_layer = make_runner(True), make_runner(False)
    got, got_tokens = greedy(fused, prompts, 4)
    assert fused_steps == ([40] * 4 if fused_here else [])
    want, want_tokens = greedy(per_layer, prompts, 4)
    assert got_tokens == want_tokens
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    for (k, v), (k2, v2) in zip(fused.kv_caches, per_layer.kv_caches):
        assert torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("quantization", ["q4", "int8"])
def test_many_rows_take_the_fused_step_on_the_linears_own_route(quantization, deterministic, fused_steps, cpu_route):
    """More rows than the GEMV serves: each linear takes, inside the step, the route the per-layer linear takes for
    that many rows: where the process has the AMX tiles, from quant_gemm.AMX_MIN_ROWS on, the grouped blocks
    dequantized to bf16 a panel at a time (quant_amx's product); else, and under --deterministic at every count, the
    tiles GEMM (the GEMV's integer sums and float order, quant_tiles.h). So a 40-row decode-only step matches the
    per-layer path as a 3-row one does; where the route has no tiles GEMM (portable C) the step leaves such rows to
    the per-layer path. (deterministic: the linears as batch_invariant.py leaves them.)"""
    made = []

    def make(fused: bool):
        made.append(tiny_runner(quantization, fused=fused))
        for linear in block_linears(made[-1]):
            linear.allow_dequant = not deterministic
        return made[-1]

    assert_40_rows_match(make, fused_steps, quant_gemm.tiles_from("Q4_1") is not None)
    if fused_steps:
        layers = made[0].model.decode_step._table.c_layers
        on_amx = [layer.amx_from[i] <= 40 for layer in layers for i in range(len(ds.LINEARS))]
        assert all(on_amx) if ds.amx() and not deterministic else not any(on_amx)


def test_many_rows_over_bf16_weights_take_the_fused_step_on_the_amx_tiles(fused_steps, cpu_route):
    """Past the GEMV's 16 rows a bf16 linear takes the AMX tiles inside the step, the product the per-layer
    linear runs from bf16_gemm.AMX_MIN_ROWS rows (amx_tiles.h: the same bf16 pairs and per-element order), so a
    40-row step matches the per-layer path; where the build or process has no tiles the step leaves such rows
    to the per-layer path."""
    assert_40_rows_match(lambda fused: tiny_runner(None, weight_dtype=torch.bfloat16, fused=fused), fused_steps,
                         ds.amx())


def test_models_the_fused_step_does_not_cover_take_the_per_layer_path(fused_steps):
    assert tiny_runner("q4", "qwen3").model.decode_step is None  # qk_norm
    tp = tiny_runner("q4")  # a tensor-parallel rank wraps o_proj/down in collectives after the build
    tp.model.layers[1].down = RowParallelLinear(tp.model.layers[1].down, group=None)
    assert not tp.model.decode_step.accepts(AttentionBatch(torch.zeros(1), 1, 16, num_decode_tokens=1), 1,
                                            tp.kv_caches)
    float_model = tiny_runner("none")  # float weights
    float_model.run([SeqChunk([1, 2], 0, table(0))])
    float_model.run([SeqChunk([3], 2, table(0))])
    assert fused_steps == []


def kernel_inputs(runner, rows: int = 2):
    """The step table of a tiny runner's model plus one step's inputs over its caches."""
    step = runner.model.decode_step
    runner.run([SeqChunk([1, 2, 3], 0, table(i)) for i in range(rows)])
    t = step._table_for(runner.kv_caches)
    tables = prepare_tables(torch.tensor([table(i) for i in range(rows)]), torch.full((rows,), 4), *t.cache_shape[:2])
    x = torch.randn(rows, t.shape.hidden, generator=torch.Generator().manual_seed(0))
    slots = torch.tensor([i * BLOCKS_PER_SEQ * 16 + 3 for i in range(rows)])
    return t, x, torch.full((rows,), 3), slots, tables


def test_every_route_matches_the_native_build(cpu_route):
    with build.using_route(None):
        runner = tiny_runner("q4")
        t, x, positions, slots, tables = kernel_inputs(runner)
        native = t.run(x.clone(), positions, slots, tables, 2)
    layers, final_norm, cos, sin = t.kept
    routed = ds.DecodeStepTable(t.shape, layers, final_norm, cos, sin)
    assert build.isa(routed.lib) == cpu_route
    torch.testing.assert_close(routed.run(x.clone(), positions, slots, tables, 2), native, **TOL)


def test_bad_tables_and_steps_raise_value_errors(cpu_route):
    runner = tiny_runner("q4")
    t, x, positions, slots, tables = kernel_inputs(runner)
    layers, final_norm, cos, sin = t.kept
    blocks, type_name = layers[0].linears[0]
    cut = dataclasses.replace(layers[0], linears=((blocks[:-1], type_name), *layers[0].linears[1:]))
    for broken in ([cut, *layers[1:]],
                   [dataclasses.replace(layers[0], k_cache=layers[0].k_cache.double()), *layers[1:]],
                   [dataclasses.replace(layers[0], linears=((blocks, "Q5_K"), *layers[0].linears[1:])), *layers[1:]]):
        with pytest.raises(ValueError):
            ds.DecodeStepTable(t.shape, broken, final_norm, cos, sin)
    with pytest.raises(ValueError):
        t.run(x.clone(), positions, slots + (1 << 40), tables, 2)  # a slot outside the cache
    with pytest.raises(ValueError):
        t.run(x.clone(), positions + 10**6, slots, tables, 2)  # a position past the rope tables
    with pytest.raises(ValueError):
        t.run(x[:1].clone(), positions, slots, tables, 2)  # rows and tables disagree
    with pytest.raises(ValueError):  # block ids outside the cache: the existing table check
        prepare_tables(torch.tensor([[0, 10**6]]), torch.tensor([20]), *t.cache_shape[:2])
    assert torch.isfinite(t.run(x.clone(), positions, slots, tables, 2)).all()  # the table still works


def teacher_forced(runner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] of decode steps fed `tokens` one at a time after prompt."""
    runner.run([SeqChunk(prompt, 0, table(0))])
    return torch.cat([runner.run([SeqChunk([t], len(prompt) + i, table(0))]) for i, t in enumerate(tokens)])


@pytest.mark.slow
def test_default_model_fused_step_matches_the_per_layer_path(fused_steps):
    """Over 30 layers a last-bit difference (e.g. vector against scalar expf in the softmax: which
    one a loop uses depends on its buffer's alignment) flips the int8 rounding of later activations,
    and these amplify: the per-layer path itself, fed embeddings nudged by one float32 ulp of their
    largest value, moved these 32 rows' logits by 4.3% (median) and 14.7% (max) relative error, with 1
    top-1 flip. The fused path measured 6.6% max. Bounds: median 10%, max 25%, at most 3 flips; a
    wrong head, position, slot or weight gives O(100%)."""
    from runtime.load import load_model

    cfg, tensors, tok, _ = load_model(None)
    fused, per_layer = (make_runner(cfg, dict(tensors), 64 << 20)[0] for _ in range(2))
    per_layer.model.decode_step = None
    prompt = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    _, (tokens,) = greedy(per_layer, [prompt], 32)
    want = teacher_forced(per_layer, prompt, tokens[:32])
    got = teacher_forced(fused, prompt, tokens[:32])
    assert fused_steps == [1] * 32
    error = (got - want).norm(dim=1) / want.norm(dim=1)
    assert error.median() < 0.1 and error.max() < 0.25
    assert (got.argmax(1) != want.argmax(1)).sum() <= 3


def block_linears(runner) -> list:
    from runtime.accel.block_linear import BlockQuantLinear
    return [v for mod in runner.model.modules() for v in vars(mod).values() if isinstance(v, BlockQuantLinear)]


@pytest.mark.parametrize("quantization", ["q4", "int8"])
def test_grouped_weights_give_the_file_layouts_logits(quantization, monkeypatch, fused_steps, cpu_route):
    """On the SIMD routes the linears hold 8-row groups (cute_kernels/cpu/row_groups.py): prefill (tiles GEMM),
    the fused step and the LM head's GEMV must give the file layout's logits bit for bit."""
    from runtime.accel import block_linear
    grouped = tiny_runner(quantization)
    types = {lin.type_name for lin in block_linears(grouped)}
    assert any(t.endswith("_R8") for t in types) == (cpu_route != "portable-c"), types  # (the head: 260 rows, not whole groups)
    monkeypatch.setattr(block_linear, "gemv_layout", lambda type_name, blocks: (type_name, blocks))
    plain = tiny_runner(quantization)
    assert not any(lin.type_name.endswith("_R8") for lin in block_linears(plain))
    got, got_tokens = greedy(grouped, PROMPTS[3], 8)
    want, want_tokens = greedy(plain, PROMPTS[3], 8)
    assert fused_steps == [3] * 16 and got_tokens == want_tokens
    assert all(torch.equal(g, w) for g, w in zip(got, want))
