"""Streamed text that may hold a marker (a tool call's start, a reasoning end tag) split over deltas."""
from __future__ import annotations


def safe_end(text: str, marker: str) -> int:
    """How much of text may be sent before knowing more: up to the marker, or to a tail that may
    still grow into it."""
    i = text.find(marker)
    if i >= 0:
        return i
    return next((len(text) - k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                 if marker.startswith(text[-k:])), len(text))
