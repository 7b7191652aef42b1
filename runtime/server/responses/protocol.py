"""The Responses API's request, as far as this server serves it: text input and function tools.
Anything else (built-in tools, images, files, reasoning items) fails validation: a 400 naming it."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.server.openai.json_checks import JsonObject, JsonText, Schema, Str
from runtime.server.openai.protocol import Bool, Int, Number
from runtime.server.openai.protocol_tools import Name


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["input_text", "output_text", "text"]
    text: Str


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Str | list[TextPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function_call"]
    call_id: Annotated[Str, Field(min_length=1)]
    name: Name
    arguments: JsonText


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function_call_output"]
    call_id: Annotated[Str, Field(min_length=1)]
    output: Str | list[TextPart]


InputItem = FunctionCallItem | FunctionCallOutputItem | MessageItem


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: Name
    description: Str | None = None
    parameters: JsonObject | None = None
    strict: Bool | None = None


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: Name


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Name | None = None
    description: Str | None = None
    json_schema: Schema | None = Field(None, alias="schema")
    strict: Bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"input": "Write a haiku about the sea.", "max_output_tokens": 40},
        {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi!"}], "stream": True}]})
    model: Str | None = None
    input: Annotated[Str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)] = Field(
        description="a string, or a list of message / function_call / function_call_output items")
    instructions: Str | None = None
    previous_response_id: Str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: Bool = True
    text: TextConfig | None = None
    max_output_tokens: Int(ge=1) | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    stream: Bool = False
    store: Bool = True
    metadata: dict[str, Str] | None = None

    def dump(self, name: str) -> Any:
        """A field as the JSON it came as (echoed in the Response)."""
        value = getattr(self, name)
        if isinstance(value, list):
            return [v.model_dump(by_alias=True, exclude_none=True) for v in value]
        return value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value


class ResponseStreamEvent(BaseModel):
    """One event of a streamed Response (its `event:` line names the type too)."""

    model_config = ConfigDict(extra="allow")
    type: str
    sequence_number: int
