"""Run by instructor's own interpreter (its jiter pin conflicts with the openai SDK the tests use):
`python instructor_client.py BASE_URL MODEL [person]` prints one JSON line of what instructor returned
(person: the real model's extraction, in both modes)."""
import json
import sys
from typing import Literal

import instructor
import openai
from pydantic import BaseModel, Field


class City(BaseModel):
    name: Literal["Paris", "Oslo"]
    population: int = Field(ge=0, le=99)


class Person(BaseModel):  # bounded: a 135M model left free may repeat itself inside a string
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def person(base_url: str, model: str) -> None:
    text = "Alice is 30 years old. Extract her name and age."
    ask = dict(model=model, response_model=Person, messages=[{"role": "user", "content": text}], max_tokens=60,
               temperature=0, max_retries=0)
    out = {}
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), mode=mode)
        out[mode.value] = client.chat.completions.create(**ask).model_dump()
    print(json.dumps(out))


def main(base_url: str, model: str) -> None:
    out = {}
    ask = dict(model=model, response_model=City, messages=[{"role": "user", "content": "A city?"}], max_tokens=80,
               temperature=0, max_retries=0)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), mode=mode)
        city = client.chat.completions.create(**ask)
        out[mode.value] = {"type": type(city).__name__, **city.model_dump()}
    partials = list(client.chat.completions.create_partial(**ask))
    out["partial"] = {"count": len(partials), "last": partials[-1].model_dump()}
    print(json.dumps(out))


if __name__ == "__main__":
    (person if sys.argv[3:] == ["person"] else main)(*sys.argv[1:3])
