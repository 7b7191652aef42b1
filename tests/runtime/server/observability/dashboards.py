"""Reading Grafana dashboards' PromQL and resolving each selector against a /metrics scrape.

A selector `name{label op "value", ...}` (or a bare name) resolves when the scrape has a sample of
that exact name whose labels satisfy every matcher, once Grafana's variables are filled in as a
Prometheus scraping this server would see them: job and instance are the scrape's own labels (left
out), $model_name is the served model, $engine any engine, an SLO variable each of its choices.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

METRIC = re.compile(r"^(?:vllm:|cute_serve:|http_|process_|python_)|^up$")
# a name, then optionally its {matchers} (strings may hold any character but an unescaped quote)
SELECTOR = re.compile(r'(?<![\w:$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})?')
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
LABEL_VALUES = re.compile(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus, never on /metrics
INTERVALS = ("$__rate_interval", "$__interval", "$__range")


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str  # with the dashboard's variables


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value) with the variables filled in
    label: str | None = None  # label_values(selector, label): the label the series must carry
    optional: bool = False  # inside `(... or vector(0))`: no matching series is fine


def load(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def queries(path: Path) -> Iterator[Query]:
    """Every panel target's expr (collapsed rows' panels too) and every query variable's query."""
    board = load(path)

    def walk(panels: list[dict]) -> Iterator[Query]:
        for p in panels:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    yield Query(path.name, p.get("title", ""), t["expr"])
            yield from walk(p.get("panels") or [])

    yield from walk(board.get("panels", []))
    for v in board.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            yield Query(path.name, f"variable {v.get('name')}", q)


def variable_choices(path: Path) -> dict[str, list[str]]:
    """Each custom variable's values (the SLO choices), to fill each in turn."""
    out = {}
    for v in load(path).get("templating", {}).get("list", []):
        if v.get("type") == "custom":
            out[v["name"]] = [o["value"] for o in v.get("options", [])] or [
                part.split(":")[-1].strip() for part in v.get("query", "").split(",")]
    return out


def selectors(expr: str, model_name: str, choices: dict[str, list[str]]) -> list[Selector]:
    """The metric selectors of expr, once per combination of the custom variables it names."""
    label_values = LABEL_VALUES.match(expr.strip())
    label = label_values.group(2) if label_values else None
    body = label_values.group(1) if label_values else expr
    for interval in INTERVALS:
        body = body.replace(interval, "1m")
    out = []
    zero_groups = _or_zero_groups(body)
    for found in SELECTOR.finditer(body):
        name, braces = found.groups()
        if not METRIC.search(name):
            continue
        optional = any(a <= found.start() and found.end() <= b for a, b in zero_groups)
        matchers = [(k, op, v) for k, op, v in MATCHER.findall(braces or "") if k not in SCRAPE_LABELS]
        for filled in _fill(matchers, model_name, choices):
            out.append(Selector(name, tuple(filled), label, optional))
    return out


def _or_zero_groups(expr: str) -> list[tuple[int, int]]:
    """(start, end) of each operand that `or vector(0)` follows: back to its opening parenthesis."""
    spans = []
    for hit in re.finditer(r"\s+or\s+vector\(0\)", expr):
        depth, start = 0, 0
        for i in range(hit.start() - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(expr[i], 0)
            if depth < 0:
                start = i
                break
        spans.append((start, hit.start()))
    return spans


def _fill(matchers: list[tuple[str, str, str]], model_name: str,
          choices: dict[str, list[str]]) -> Iterator[list[tuple[str, str, str]]]:
    combos: list[list[tuple[str, str, str]]] = [[]]
    for k, op, v in matchers:
        var = re.fullmatch(r"\$\{?(\w+)(?::\w+)?\}?", v)
        if var is None:
            values = [v]
        elif var.group(1) in choices:
            values = choices[var.group(1)]
        elif k == "model_name":
            values = [model_name]
        else:  # a multi-value query variable on "All": any value
            values, op = [".*"], "=~"
        combos = [c + [(k, op, value)] for c in combos for value in values]
    yield from combos


def _matches(labels: dict[str, str], matchers: tuple[tuple[str, str, str], ...]) -> bool:
    for k, op, v in matchers:
        have = labels.get(k, "")
        ok = {"=": have == v, "!=": have != v, "=~": re.fullmatch(v, have) is not None,
              "!~": re.fullmatch(v, have) is None}[op]
        if not ok:
            return False
    return True


def unresolved(sel: Selector, samples: dict[str, list[dict[str, str]]]) -> str | None:
    """Why the selector finds nothing on this scrape, or None when it resolves."""
    series = samples.get(sel.name)
    if not series:
        return f"no series {sel.name}"
    found = [labels for labels in series if _matches(labels, sel.matchers)]
    if not found and not sel.optional:
        shown = ", ".join(f'{k}{op}"{v}"' for k, op, v in sel.matchers)
        return f"no {sel.name} series matches {{{shown}}}"
    if sel.label not in (None, *SCRAPE_LABELS) and not any(sel.label in labels for labels in found):
        return f"{sel.name} has no label {sel.label}"
    return None


def by_name(text_samples: list[tuple[str, dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for name, labels in text_samples:
        out.setdefault(name, []).append(labels)
    return out
