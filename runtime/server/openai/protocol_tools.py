"""Request and response schemas of structured output and tool calling (OpenAI's shapes):
response_format, tools, tool_choice, assistant tool_calls."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

from runtime.server.openai.json_checks import JsonObject, JsonText, Schema, Str

Name = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: Name
    description: Str | None = None
    json_schema: Schema = Field(default_factory=dict, alias="schema")
    strict: Annotated[bool, Strict()] | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Name
    description: Str | None = None
    parameters: JsonObject | None = None
    strict: Annotated[bool, Strict()] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Name


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: Str
    arguments: JsonText  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: Str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None
