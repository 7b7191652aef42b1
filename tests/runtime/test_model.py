"""Our model and runner against transformers on tiny random models, and KV-path invariance."""
import pytest
import torch

from runtime.accel.cpu_linear import PackedCpuLinear
from runtime.build import make_runner
from runtime.sequence import SeqChunk
from tests.hf_tiny import our_config, state_dict, tiny_hf_model

# float32 everywhere: differences come only from summation order (observed ~1e-6).
ATOL = 1e-4

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}

CASES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "gqa-8to1": ("llama", {"num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8}),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qknorm": ("qwen3", {}),
}


def runner_for(hf, arch, num_blocks=64, block_size=16):
    cfg = our_config(hf, arch)
    budget = num_blocks * block_size * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    runner, ledger = make_runner(cfg, state_dict(hf), budget, block_size=block_size, backend="torch")
    assert ledger.num_blocks == num_blocks
    return runner


def test_kv_budget_is_read_after_the_weights_are_resident_and_the_ledger_counts_them():
    hf = tiny_hf_model("llama")
    cfg, tensors = our_config(hf, "llama"), state_dict(hf)
    seen = []

    def budget():
        seen.append(len(tensors))  # build_model pops each checkpoint tensor as the model takes it
        return 1 << 20

    runner, ledger = make_runner(cfg, tensors, budget, backend="torch")
    assert seen == [0]
    params = cfg.num_parameters() * 4  # what the checkpoint holds, fp32
    packed = sum(linear.packed.numel() * 4 for linear in runner.model.linears() if isinstance(linear, PackedCpuLinear))
    assert ledger.weight_bytes == params + packed  # the packed copies count too
    assert isinstance(runner.model.head, PackedCpuLinear) and packed > 0  # fp32 on the CPU: every linear is packed
    assert ledger.num_blocks == (1 << 20) // (ledger.bytes_per_token * 16)
    assert f"weights {ledger.weight_bytes / 2**20:.1f} MiB" in ledger.describe()


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_logits_match_transformers(case):
    arch, kw = CASES[case]
    hf = tiny_hf_model(arch, **kw)
    runner = runner_for(hf, arch)
    ids = torch.randint(0, 128, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = runner.run([SeqChunk(ids, 0, list(range(7)), num_logits=len(ids))])
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


def test_chunked_and_decode_paths_agree_with_one_prefill():
    hf = tiny_hf_model("llama")
    ids = torch.randint(0, 128, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    runner = runner_for(hf, "llama")
    table = [5, 9, 2, 30, 7]  # scattered, non-contiguous blocks
    got = [runner.run([SeqChunk(ids[:23], 0, table, num_logits=23)])]
    got.append(runner.run([SeqChunk(ids[23:50], 23, table, num_logits=27)]))  # chunk over a paged prefix
    for p in range(50, 70):  # one token at a time: the decode path
        got.append(runner.run([SeqChunk([ids[p]], p, table)]))
    torch.testing.assert_close(torch.cat(got), ref, atol=ATOL, rtol=0)


def test_mixed_batch_equals_each_sequence_alone():
    hf = tiny_hf_model("qwen3")
    runner = runner_for(hf, "qwen3")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (1, 17, 40, 33)]
    tables = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9, 10]]
    # step 1: prefill the first 16 tokens of prompt 3 alone so it is mid-prompt in the mixed step
    runner.run([SeqChunk(prompts[3][:16], 0, tables[3], num_logits=0)])
    # step 2: one mixed step: a 1-token prompt, two whole prompts, and the rest of prompt 3
    mixed = runner.run([SeqChunk(prompts[0], 0, tables[0]), SeqChunk(prompts[1], 0, tables[1]),
                        SeqChunk(prompts[2], 0, tables[2]), SeqChunk(prompts[3][16:], 16, tables[3])])
    with torch.no_grad():
        alone = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    torch.testing.assert_close(mixed, alone, atol=ATOL, rtol=0)
