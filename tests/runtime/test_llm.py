"""The offline API as a user meets it: LLM(model=path) loads, logs its ledger, shows progress, reports metrics."""
import logging

import pytest

from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.server_utils import write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def fresh_logger():
    """The engine logger as a fresh process has it: no handlers, nothing configured."""
    log = logging.getLogger("cute_serve")
    saved = (log.handlers[:], log.level, log.propagate)
    log.handlers.clear()
    yield log
    log.handlers[:], log.level, log.propagate = saved


def test_llm_from_a_model_path_generates_with_metrics_ledger_and_progress(model_dir, fresh_logger, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as outside pytest: the root logger is bare
    llm = LLM(model=model_dir, kv_cache_memory=4 << 20, device="cpu")
    outs = llm.generate(["hello", [1, 2, 3]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    err = capsys.readouterr().err
    assert "KV cache (bfloat16, " in err and "blocks x 16 tokens" in err  # the memory ledger
    assert "2/2" in err  # the progress bar ran to completion
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5]
    assert outs[0].outputs[0].text and outs[0].outputs[0].finish_reason == "length"
    for o in outs:
        m = o.metrics
        assert 0 <= m["queue_time"] <= m["ttft"] <= m["e2e"] and m["tpot"] > 0


def test_llm_rejects_bad_engine_options(model_dir):
    with pytest.raises(TypeError, match="unknown engine options"):
        LLM(model=model_dir, kv_cache_size=5)
    for bad in (dict(block_size=0), dict(max_num_seqs=0), dict(max_num_batched_tokens=-1), dict(max_model_len=0),
                dict(kv_cache_fraction=0.0), dict(scheduler="fifo")):
        with pytest.raises(UserError):
            LLM(model=model_dir, **bad)
