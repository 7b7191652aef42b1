"""What one grammar may cost: size limits before a compile, a time limit that kills the compile's
worker process, a cache bounded in bytes, a step's bounded wait for a mask (on the default model's
real 49k vocabulary, where an ambiguous grammar's masks blow up), and the list of schema keywords
xgrammar does not enforce kept true against xgrammar itself."""
import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from runtime.load import load_model
from structured.compile import GrammarError
from structured.keywords import UNENFORCED, unenforced_keywords
from structured.limits import MAX_ENUM_VALUES, GrammarLimits, json_chars_over
from structured.processor import SLOW_MASKS, GrammarProcessor
from structured.service import GrammarService
from structured.spec import CompiledStructure
from tests.tiny_engine import EOS, TINY_VOCAB, byte_tokenizer

SLOW_SCHEMA = json.dumps({"type": "string", "pattern": "^[a-z]{0,20000}$"})  # 50 bytes, ~30 s to compile
AMBIGUOUS = 'root ::= e\ne ::= e e e | e e | [a-z] | ""'  # the issue's 27-byte grammar


def service(**limits) -> GrammarService:
    return GrammarService(byte_tokenizer(), TINY_VOCAB, GrammarLimits(**limits))


@pytest.mark.parametrize("kind, text, words", [
    ("json_schema", json.dumps({"enum": [f"v{i}" for i in range(20_000)]}), "--max-grammar-bytes"),
    ("json_schema", json.dumps({"enum": [f"v{i}" for i in range(MAX_ENUM_VALUES + 1)]}), "at most 1000"),
    ("choice", json.dumps(["x" * 2000] * 8), "at most 15000 characters"),
    ("grammar", "\n".join(f"r{i} ::= \"a\"" for i in range(1001)) + "\nroot ::= r0", "1000 rules"),
    ("json_schema", json.dumps(json.loads("[" * 40 + "]" * 40)), "deeper than 32"),
])
def test_a_structure_over_a_size_limit_is_refused_at_once_naming_the_limit(kind, text, words):
    svc = service()
    started = time.monotonic()
    with pytest.raises(GrammarError, match=words):
        svc.submit(kind, text)
    assert time.monotonic() - started < 0.5 and svc._pool is None  # nothing was compiled


@pytest.mark.parametrize("value", [
    {"type": "object", "properties": {"a": {"enum": ["x", "yy", 3, None, True]}, "b": {"items": [[], {}]}}},
    ["\u00e9" * 40, {"k": [1, 2.5, "s"]}], "plain text", {"": ""}, [],
])
def test_the_size_walk_never_overstates_a_schema(value):
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    assert not json_chars_over(value, size)  # a lower bound: what fits is never refused
    assert json_chars_over(value, 0) == bool(value)  # anything in it is counted


def test_the_size_walk_stops_once_over_the_limit_whatever_lies_beyond():
    """Bounded by the limit, not the value: a cycle (no JSON has one) would never end a whole walk."""
    loop: list = ["x" * 100]
    loop.append(loop)
    assert json_chars_over(loop, 10_000)
    assert json_chars_over({"enum": ["v" * 10] * 10**7}, 1000)  # 10 million members, walked ~80 of them


def test_a_compile_past_its_time_limit_is_killed_and_fails_fast_when_sent_again():
    svc = service(compile_seconds=1.0, compile_workers=1)
    try:
        assert svc.compile("regex", "[ab]+") is not None  # the worker is up
        worker = _worker(svc)
        started = time.monotonic()
        with pytest.raises(GrammarError, match="--max-grammar-compile-seconds"):
            svc.compile("json_schema", SLOW_SCHEMA)
        assert time.monotonic() - started < 5
        assert not _alive(worker)  # killed, not left to run
        started = time.monotonic()
        with pytest.raises(GrammarError, match="--max-grammar-compile-seconds"):
            svc.compile("json_schema", SLOW_SCHEMA)  # remembered: no second compile
        assert time.monotonic() - started < 0.1
        assert svc.compile("regex", "[cd]+") is not None  # a fresh worker serves the next one
    finally:
        svc.close()


def test_a_compile_nobody_waits_for_is_killed_and_shared_ones_are_not():
    svc = service(compile_workers=1)
    try:
        svc.compile("regex", "[ab]+")
        first, second = svc.submit("json_schema", SLOW_SCHEMA), svc.submit("json_schema", SLOW_SCHEMA)
        time.sleep(0.5)
        worker = _worker(svc)
        svc.cancel(first)
        time.sleep(0.3)
        assert worker.is_running() and svc.num_compiling == 1  # the second caller still waits for it
        svc.cancel(second)
        time.sleep(0.5)
        assert not _alive(worker)  # its process was killed
        assert svc.num_compiling == 0 and svc.compile("regex", "[cd]+") is not None
    finally:
        svc.close()


def test_a_busy_engine_holds_a_compile_to_its_cpu_share_and_its_time_limit_still_kills_it():
    svc = service(compile_seconds=2.0, compile_workers=1, compile_cpu_share=0.25)
    svc.govern(lambda: True)  # an engine with requests throughout
    try:
        svc.compile("regex", "[ab]+")
        worker = _worker(svc)
        slow = svc.submit("json_schema", SLOW_SCHEMA)
        cpu0, t0 = sum(worker.cpu_times()[:2]), time.monotonic()
        time.sleep(1.2)
        share = (sum(worker.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        assert share < 0.45, share  # 0.25 asked; a free worker takes a whole core (~1.0)
        with pytest.raises(GrammarError, match="--max-grammar-compile-seconds"):
            slow.result(timeout=10)
        assert not _alive(worker)  # killed though it spent most of its time stopped
        assert svc.compile("regex", "[cd]+") is not None
    finally:
        svc.close()
    assert not svc._governor.stopped  # none left stopped


def test_the_cache_is_bounded_in_bytes_not_entries():
    one = service().compile("json_schema", json.dumps({"enum": ["x" * 40 + str(i) for i in range(200)]}))
    svc = service(cache_bytes=3 * one.memory_size_bytes)
    try:
        for n in range(8):
            svc.compile("json_schema", json.dumps({"enum": [f"{'x' * 40}{i}-{n}" for i in range(200)]}))
        assert 0 < svc.cache.bytes <= 3 * one.memory_size_bytes and len(svc.cache) <= 3
    finally:
        svc.close()


@pytest.fixture(scope="module")
def ambiguous():
    """(the ambiguous grammar compiled over the real vocabulary, a two-letter token of it)."""
    _, _, tokenizer, _ = load_model(None)  # the real vocabulary: single-byte tokens never blow up
    svc = GrammarService(tokenizer, 49152)
    try:
        return svc.compile("grammar", AMBIGUOUS), tokenizer.encode("ab", add_special_tokens=False)[0]
    finally:
        svc.close()


def slow_processor(compiled, letter, tokens: int = 60) -> GrammarProcessor:
    """A processor of the ambiguous grammar past `tokens` letters: at 60 each mask takes ~1 s."""
    slow = GrammarProcessor(compiled, [0], wait=0.05)
    for _ in range(tokens):
        assert slow.matcher.accept_token(letter)
    return slow


def test_a_slow_mask_beside_ready_rows_is_deferred_then_ends_the_sequence_once_late(ambiguous):
    compiled, letter = ambiguous
    slow, quick = slow_processor(compiled, letter), GrammarProcessor(compiled, [0], wait=0.05)
    slow.prefetch(), quick.prefetch()
    quick._next_mask.result()  # the forward pass: long enough for the quick mask, not the slow one
    logits = torch.zeros(2, 49152)
    started = time.monotonic()
    GrammarProcessor.apply_batch(logits, [0, 1], [slow, quick])
    assert time.monotonic() - started < 0.03  # the quick row's step is not held for the slow mask
    assert slow.deferred() and not quick.deferred()
    assert torch.isinf(logits[1]).any() and not torch.isinf(logits[0]).any()  # the quick row is masked
    assert quick.accept(letter)
    time.sleep(0.06)  # the next steps, past the slow mask's deadline
    quick.prefetch()
    quick._next_mask.result()
    logits = torch.zeros(2, 49152)
    GrammarProcessor.apply_batch(logits, [0, 1], [slow, quick])
    assert not slow.deferred() and not torch.isinf(logits[0]).any()  # late: its token is refused
    assert not slow.accept(letter) and slow.ending()[0] == "error" and "--max-mask-wait-ms" in slow.ending()[1]
    if hasattr(os, "SCHED_IDLE") and slow._filler:  # the late fill runs on, yielding its core to the engine
        assert os.sched_getscheduler(slow._filler[0]) == os.SCHED_IDLE


def test_a_step_whose_every_row_waits_for_its_mask_waits_a_bounded_time(ambiguous):
    compiled, letter = ambiguous
    slow = slow_processor(compiled, letter)
    logits = torch.zeros(1, 49152)
    started = time.monotonic()
    GrammarProcessor.apply_batch(logits, [0], [slow])  # nobody else to hold: it waits, to the deadline
    assert 0.045 < time.monotonic() - started < 0.5  # not the second the mask takes
    assert not slow.deferred() and not slow.accept(letter) and slow.ending()[0] == "error"


def in_time_steps(proc: GrammarProcessor, letter: int, steps: int, quick: GrammarProcessor | None = None) -> list[bool]:
    """Steps whose forward outlasts proc's fill (its mask in time), beside quick's row when given: what
    accept said after each."""
    accepted = []
    for _ in range(steps):
        procs = [proc] + ([quick] if quick else [])
        for p in procs:
            p.prefetch()
            p._next_mask.result()
        logits = torch.zeros(len(procs), 49152)
        GrammarProcessor.apply_batch(logits, list(range(len(procs))), procs)
        assert torch.isinf(logits[0]).any() and not proc.deferred()  # masked: it was in time
        accepted.append(proc.accept(letter))
        if quick:
            assert quick.accept(letter)
    return accepted


def test_masks_in_time_but_each_over_the_cpu_budget_beside_others_end_the_sequence_after_three(ambiguous):
    compiled, letter = ambiguous
    proc = slow_processor(compiled, letter, tokens=30)  # each mask now takes ~0.15 s of CPU
    quick = GrammarProcessor(compiled, [0], wait=0.05)
    assert in_time_steps(proc, letter, SLOW_MASKS, quick) == [True] * (SLOW_MASKS - 1) + [False]
    assert proc.ending()[0] == "error" and "--max-mask-cpu-ms" in proc.ending()[1]


def test_slow_masks_in_time_end_nothing_while_the_sequence_is_alone(ambiguous):
    compiled, letter = ambiguous
    proc = slow_processor(compiled, letter, tokens=30)
    assert in_time_steps(proc, letter, SLOW_MASKS + 1) == [True] * (SLOW_MASKS + 1)  # nobody else to slow


def test_every_keyword_listed_as_unenforced_is_not_enforced_by_xgrammar():
    # Each keyword with an instance that breaks it: xgrammar's matcher accepts the instance. When a
    # new xgrammar enforces one, this fails and the keyword leaves UNENFORCED.
    cases = {"allOf": ({"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}, "11"),
             "not": ({"type": "integer", "not": {"const": 3}}, "3"),
             "if": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, '{"a": 1}'),
             "multipleOf": ({"type": "integer", "multipleOf": 7}, "15"),
             "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
             "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
             "dependentRequired": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                    "dependentRequired": {"a": ["b"]}}, '{"a": 1}')}
    svc = service()
    try:
        for keyword, (schema, breaking) in cases.items():
            matcher = __import__("xgrammar").GrammarMatcher(svc.compile("json_schema", json.dumps(schema)))
            assert matcher.accept_string(breaking), keyword
            assert keyword in UNENFORCED and any(f.startswith(keyword) for f in unenforced_keywords(schema))
    finally:
        svc.close()
    assert unenforced_keywords({"properties": {"not": {"type": "string"}}}) == []  # a property, not a keyword
    assert unenforced_keywords({"$defs": {"a/b": {"multipleOf": 2}}}) == ["multipleOf at /$defs/a~1b"]


def _worker(svc: GrammarService) -> psutil.Process:
    """The pool's one worker process."""
    (pid,) = svc.worker_pids()
    return psutil.Process(pid)


def test_masks_of_a_compiled_grammar_match_xgrammar_in_process():
    svc = service()
    try:
        proc = GrammarProcessor(svc.compile("regex", "[a-c]+"), [EOS])
    finally:
        svc.close()
    row = torch.zeros(TINY_VOCAB)
    proc(row)
    assert torch.isfinite(row).nonzero().flatten().tolist() == [ord("a"), ord("b"), ord("c")]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_mask_budgets_reach_each_sequence(ambiguous):
    limits = GrammarLimits(mask_wait_ms=30, mask_cpu_ms=4)
    proc = CompiledStructure.under(limits, ambiguous[0], 0.0).processor([0])
    assert (proc.wait, proc.cpu) == (0.03, 0.004)



def test_a_process_whose_server_never_closed_its_service_still_exits():
    """A live server's service (the warm-up compiled on its workers) is not closed when the app goes away;
    multiprocessing's exit handler joins live workers, so without the service's own handler stopping its
    pool first a pytest run of one server test waited at exit forever."""
    test = "tests/runtime/server/test_server_disconnect.py::test_non_streaming_client_timeout_aborts"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
