"""After sampling: append the token, detokenize incrementally, apply stop conditions."""
from __future__ import annotations

from runtime.sequence import Sequence


def stop_hold_back(seq: Sequence) -> int:
    """Chars to hold back while streaming: the tail that could still grow into a stop string."""
    return max((len(s) for s in seq.params.stop), default=1) - 1


def append_token(seq: Sequence, token: int, eos_ids: set[int], max_model_len: int) -> None:
    """Add one sampled token to seq, updating text and finish state."""
    p = seq.params
    seq.token_ids.append(token)
    n_out = seq.num_output_tokens
    stop_id = (not p.ignore_eos and token in eos_ids) or token in p.stop_token_ids
    if stop_id and n_out >= p.min_tokens:
        seq.finish_reason, seq.stop_reason = "stop", (token if token in p.stop_token_ids else None)
        seq.text += seq.detokenizer.flush()
        return
    prev_len = len(seq.text)
    seq.text += seq.detokenizer.add(token)
    if p.stop and len(seq.text) > prev_len and n_out >= p.min_tokens:
        longest = max(len(s) for s in p.stop)
        start = max(0, prev_len - longest + 1)  # a stop string may span the previous tokens
        hits = [(i, s) for s in p.stop if (i := seq.text.find(s, start)) >= 0]
        if hits:
            i, s = min(hits)
            seq.text = seq.text[:i]
            seq.finish_reason, seq.stop_reason = "stop", s
            return
    if n_out >= p.max_tokens or len(seq.token_ids) >= max_model_len:
        seq.finish_reason = "length"
        seq.text += seq.detokenizer.flush()


def take_delta(seq: Sequence) -> tuple[str, list[int], list]:
    """Text, token ids and logprob records not yet streamed; while running, hold back a possible
    stop-string prefix of the text."""
    end = len(seq.text) if seq.finish_reason else max(seq.num_emitted_chars, len(seq.text) - stop_hold_back(seq))
    text = seq.text[seq.num_emitted_chars:end]
    seq.num_emitted_chars = end
    ids = seq.token_ids[seq.num_prompt_tokens + seq.num_emitted_tokens:seq.output_end]  # no full-output copy
    records = seq.logprobs[seq.num_emitted_tokens:]  # one per output token, when logprobs were asked for
    seq.num_emitted_tokens = seq.num_output_tokens
    return text, ids, records
