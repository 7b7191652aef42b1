"""OpenAI-shaped request and response schemas.

Types are checked strictly where JSON Schema is strict: a bool or a string is not a number (pydantic's
lax mode would take `false` for an int and "7" for a float), but 240.0 is an integer, as JSON Schema
says, so strict mode is not used for ints. Ranges that need the model (token ids < vocab size,
prompt + max_tokens <= context) are checked later, against the engine.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from runtime.sampling_params import MAX_LOGPROBS
from runtime.server.openai.json_checks import JsonObject, Schema, Str
from runtime.server.openai.protocol_tools import ResponseFormat, Tool, ToolCall, ToolCallDelta, ToolChoice
from runtime.tokenizer.chat_options import RESERVED, ChatOptions


def _integer(value: Any) -> Any:
    if isinstance(value, (bool, str)):
        raise ValueError("Input should be a valid integer")
    return value


# Caps on list sizes: each stop string and bias entry costs every step of the request some work.
MAX_STOP, MAX_STOP_TOKEN_IDS, MAX_LOGIT_BIAS, MAX_BATCH = 16, 64, 1024, 256

def Int(ge: int | None = None, le: int | None = None) -> Any:  # noqa: N802 (a type, spelled as one)
    """An integer field (not a bool or a string) in [ge, le]. The bounds go before the validator:
    after it, pydantic writes them into the schema as "ge"/"le", which JSON Schema does not know."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integer)]


# x-token-id marks what openapi.py bounds by the served model's vocabulary in each app's schema.
TOKEN_ID = {"x-token-id": True}
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1, json_schema_extra=TOKEN_ID), BeforeValidator(_integer)]
TOKEN_ID_KEY = r"^(0|[1-9][0-9]{0,9})$"  # a token id as a JSON object key (logit_bias)
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]
StopText = Annotated[Str, Field(min_length=1)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: Bool = False


class KVTransferParams(BaseModel):
    """vLLM's kv_transfer_params (its disaggregation proxies and vllm-router send them): a prefill request asks
    {"do_remote_decode": true}; its answer says where the prompt's KV is; the decode request carries that
    back. Other keys pass through (docs/disaggregation.md)."""

    model_config = ConfigDict(extra="allow")

    do_remote_decode: Bool = Field(False, description="prefill only: hold the prompt's KV for a decode instance")
    do_remote_prefill: Bool = Field(False, description="decode: fetch the prompt's KV from remote_host:remote_port")
    remote_engine_id: Str | None = None
    remote_block_ids: Annotated[list[Int(0)], Field(max_length=1 << 20)] | None = None
    remote_host: Str | None = None
    remote_port: Int(0, 65535) | None = None
    remote_request_id: Str | None = None
    tp_size: Int(1) | None = None


class SamplingFields(BaseModel):
    """Knobs shared by both routes: OpenAI's names, then vLLM-style extras."""

    model_config = ConfigDict(extra="allow")

    model: Str | None = Field(None, description="the served model's id (GET /v1/models); omit for the only one")
    max_tokens: Int(ge=1) | None = Field(None, description="default: the server's --default-max-tokens (1024), "
                                   "within what is left of the context")
    temperature: Annotated[Number, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[Number, Field(gt=0, le=1)] = 1.0
    n: Int(1, 128) = 1
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    # any integer: bounds near 2**63 are not exact in JSON (float) tools; the API takes it modulo 2**63
    seed: Int() | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] = 0.0
    logit_bias: dict[Str, Annotated[Number, Field(ge=-100, le=100)]] | None = Field(
        None, max_length=MAX_LOGIT_BIAS, description="token id (as a string) -> bias added to its logit",
        json_schema_extra={"propertyNames": {"pattern": TOKEN_ID_KEY, **TOKEN_ID}})
    stream: Bool = False
    stream_options: StreamOptions | None = None
    user: Str | None = None
    # extras (vLLM names)
    top_k: Int(-1, 2**31 - 1) = Field(0, description="keep the k most likely tokens; 0 or -1 = off")
    min_p: Annotated[Number, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[Number, Field(gt=0, le=10)] = 1.0
    min_tokens: Int(ge=0) = 0
    ignore_eos: Bool = False
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    skip_special_tokens: Bool = True
    include_stop_str_in_output: Bool = Field(False, description="keep the stop string that ended the output")
    # structured output: response_format (OpenAI) or one of vLLM's guided_* fields
    response_format: ResponseFormat | None = None
    guided_json: Schema | Str | None = Field(None, description="a JSON schema the output must match, or its JSON text")
    guided_regex: Str | None = None
    guided_choice: Annotated[list[Annotated[Str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_BATCH)] \
        | None = None
    guided_grammar: Str | None = Field(None, description="an EBNF grammar (xgrammar's dialect)")
    kv_transfer_params: KVTransferParams | None = Field(None, description="prefill/decode disaggregation, as "
                                                        "vLLM's NixlConnector takes it")


PromptText = Annotated[Str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = PromptText | TokenIds | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_BATCH)] \
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]


# Rules across fields, stated in the schema as the server applies them (prepare.py), so a client
# (or a contract checker) knows them: a JSON Schema cannot say "if a then b" more plainly.
ECHO_WITHOUT_LOGPROBS = [{"properties": {"echo": {"const": False}}}, {"properties": {"logprobs": {"type": "null"}}}]
TOP_LOGPROBS_NEED_LOGPROBS = [{"properties": {"top_logprobs": {"type": "null"}}},
                              {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}]


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
        {"prompt": ["The sky is", "Water is"], "n": 2, "max_tokens": 4, "stream": True,
         "stream_options": {"include_usage": True}, "logprobs": 2},
    ], "anyOf": ECHO_WITHOUT_LOGPROBS, "description": "echo cannot be combined with logprobs (no prompt logprobs)"})
    prompt: Prompt = Field(description="a string, a list of token ids, or a batch: a list of either")
    echo: Bool = False
    logprobs: Int(0, MAX_LOGPROBS) | None = Field(None, description="top logprobs per token")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: Str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Str | list[TextPart] | None = None
    name: Str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Str | None = None  # a tool message: the call it answers
    reasoning_content: Str | None = None  # an assistant's earlier thinking: not shown to the template

    def template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:  # arguments as objects, as chat templates expect them
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class ChatTemplateFields(BaseModel):
    """vLLM's chat template controls, shared by chat completions and /tokenize."""

    model_config = ConfigDict(extra="allow")
    add_generation_prompt: Bool = Field(True, description="open the assistant's turn after the messages")
    continue_final_message: Bool = Field(False, description="leave the final message open for the model to "
                                         "continue (needs add_generation_prompt: false)")
    chat_template_kwargs: JsonObject | None = Field(
        None, description="extra chat template variables, e.g. {\"enable_thinking\": false}",
        json_schema_extra={"propertyNames": {"not": {"enum": sorted(RESERVED)}}})

    def chat_options(self) -> ChatOptions:
        """Raises RequestError (a 400) for contradicting fields."""
        return ChatOptions(self.add_generation_prompt, self.continue_final_message, self.chat_template_kwargs or {})


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32,
         "temperature": 0},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], "n": 2,
         "max_completion_tokens": 6, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
         "top_logprobs": 2},
    ], "anyOf": TOP_LOGPROBS_NEED_LOGPROBS, "description": "top_logprobs needs logprobs: true"})
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int(ge=1) | None = Field(None, description="preferred over max_tokens when both are set")
    logprobs: Bool = False
    top_logprobs: Int(0, MAX_LOGPROBS) | None = Field(None, description="needs logprobs: true")
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = Field(None, description="default: auto with tools, none without")
    parallel_tool_calls: Bool = True


# -- responses ----------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV came from the prefix cache")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    kv_transfer_params: dict[str, Any] | None = Field(None, description="a prefill's answer to do_remote_decode: "
                                                      "where the prompt's KV is, for the decode request")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # with --reasoning-parser
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    kv_transfer_params: dict[str, Any] | None = Field(None, description="a prefill's answer to do_remote_decode: "
                                                      "where the prompt's KV is, for the decode request")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cute-serve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
    chat_page: Literal["loading", "ready", "failed"] | None = Field(
        None, description="the chat page at /: 'loading' for seconds after start-up, then 'ready'; absent without one")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# -- stream chunks (each SSE event's JSON; documented under text/event-stream) --------------------


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
