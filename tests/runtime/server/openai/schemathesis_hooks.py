"""Schemathesis hooks for tests/runtime/server/openai/test_server_fuzz.py (SCHEMATHESIS_HOOKS=tests.runtime.server.openai.schemathesis_hooks).

ST202 (schema-valid data must be accepted) stays on; the server's schema states every rule it can
(types, ranges, the vocabulary's token ids, echo/logprobs and top_logprobs/logprobs). Only rules no
static schema can state are let through, each by the code or parameter the 400 names:
- the prompt's token count + max_tokens against the context and the KV cache (needs the tokenizer);
- min_tokens <= max_tokens (a comparison of two fields, and max_tokens may be the server's default);
- n x prompts against the sequences the server admits (--max-num-seqs + --max-queue);
- whether a grammar compiles (a JSON schema, regex or EBNF text), and which structure fields may be
  combined (one of response_format / guided_*; tool_choice against tools);
- whether a previous_response_id names a response this server still stores;
- whether the chat template writes a final message as given, so continue_final_message can leave it open
  (and add_generation_prompt, true by default, against continue_final_message).
"""
from __future__ import annotations

import schemathesis

UNSTATABLE_CODES = {"context_length_exceeded", "too_many_sequences"}
UNSTATABLE_PARAMS = {"min_tokens", "response_format", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar", "tool_choice", "continue_final_message", "previous_response_id"}


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    if type(failure).__name__ != "RejectedPositiveData" or response.status_code != 400:
        return True
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return True
    return error.get("code") not in UNSTATABLE_CODES and error.get("param") not in UNSTATABLE_PARAMS
