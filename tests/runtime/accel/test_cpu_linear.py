"""oneDNN-packed linears: same results as F.linear at every row count, and in the model.

Tolerance: both are fp32 GEMMs with different blocking, so sums over K=576..1536 products differ
in order only: about 1e-6 relative to the output scale; 1e-4 absolute on outputs of size ~10-40.
"""
import torch
import torch.nn.functional as F

from runtime.accel.cpu_linear import PACKED_MAX_ROWS, PackedCpuLinear, pack_linear_weight
from runtime.llm import LLM
from runtime.model.linear import DenseLinear
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine


def test_packed_linear_matches_f_linear_on_both_sides_of_the_switch():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(300, 576, generator=g), torch.randn(300, generator=g)
    packed = pack_linear_weight(w)
    assert packed is not None  # CI's torch has oneDNN: the fast path must not silently vanish
    with_bias, without = PackedCpuLinear(w, b, packed), PackedCpuLinear(w, None, packed)
    for rows in (1, 7, 63, PACKED_MAX_ROWS - 1, PACKED_MAX_ROWS, 700):
        x = torch.randn(rows, 576, generator=g)
        torch.testing.assert_close(with_bias(x), F.linear(x, w, b), rtol=0, atol=1e-4)
        torch.testing.assert_close(without(x), F.linear(x, w), rtol=0, atol=1e-4)
    assert with_bias.weight_bytes() == (w.numel() + b.numel()) * 4 + packed.numel() * packed.element_size()


def test_only_fp32_cpu_weights_are_packed():
    assert pack_linear_weight(torch.randn(8, 8, dtype=torch.bfloat16)) is None
    assert pack_linear_weight(torch.randn(8)) is None


def test_the_model_packs_every_linear_and_output_is_unchanged():
    prompts = [list(range(3, 3 + n)) for n in (4, 30, 70)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    packed_engine, plain_engine = tiny_engine(), tiny_engine()
    model = packed_engine.model_runner.model
    assert all(isinstance(linear, PackedCpuLinear) for linear in model.linears())  # every layer's and the head
    assert len(model.linears()) == 4 * len(model.layers) + 1
    plain = plain_engine.model_runner.model
    for layer in plain.layers:
        for name in layer.LINEARS:
            setattr(layer, name, DenseLinear(getattr(layer, name).weight, getattr(layer, name).bias))
    plain.head = DenseLinear(plain.head.weight)
    outs = [[o.outputs[0].token_ids for o in LLM.from_engine(e).generate(prompts, params, use_tqdm=False)]
            for e in (packed_engine, plain_engine)]
    assert outs[0] == outs[1]


def test_host_allocator_tuning_applies_on_glibc():
    from runtime.accel.host_allocator import tune_host_allocator

    assert tune_host_allocator() and tune_host_allocator()  # Debian's glibc accepts it; idempotent


def test_batch_invariant_float_linear_gives_a_row_its_bits_at_any_row_count():
    """oneDNN's packed product takes another kernel for 1 row than for 2+ (a row's bits differ for this
    down_proj shape) and none other up to 1100 rows; padded to 2 rows, a row gets the same bits alone and
    anywhere in a batch, on both sides of PACKED_MAX_ROWS."""
    from runtime.accel.batch_invariant import InvariantFloatLinear, batch_invariant

    g = torch.Generator().manual_seed(3)
    w = torch.randn(576, 1536, generator=g) * 0.05
    x = torch.randn(300, 1536, generator=g)
    packed = PackedCpuLinear(w, None, pack_linear_weight(w))
    invariant = batch_invariant(packed)
    assert isinstance(invariant, InvariantFloatLinear)
    alone = invariant(x[:1])
    assert all(torch.equal(invariant(x[:m].flip(0))[-1:], alone) for m in (1, 2, 5, 8, 9, 37, PACKED_MAX_ROWS, 300))
    assert any(not torch.equal(packed(x[:m])[:1], packed(x[:1])) for m in (2, 5, 8, 9, 37, 300)), \
        "the float products became batch-invariant by themselves: InvariantFloatLinear may be dropped"
