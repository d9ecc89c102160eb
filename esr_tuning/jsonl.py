"""Reads the labelled JSONL files `eval` and `fit` take, one record a line, naming the line that is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Collection, TypeVar

T = TypeVar("T")


class BadRecord(ValueError):
    """Why a well-formed JSON line cannot be used; read_records prefixes its place in the file."""


def read_records(path: str | Path, parse: Callable[[dict], T], expected: str, what: str) -> list[T]:
    """parse(record) for every non-blank line. A line that is not JSON, or whose fields `parse` cannot
    read (KeyError, TypeError, ValueError), raises ValueError 'path:line: expected <expected>'; a
    BadRecord raised by `parse` keeps its own reason. A file with no records raises 'path: no <what>'."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(parse(json.loads(line)))
            except BadRecord as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path}:{n}: expected {expected}") from None
    if not out:
        raise ValueError(f"{path}: no {what}")
    return out


def first_record(path: str | Path) -> object | None:
    """The first line's JSON value; None when the file is empty or that line is not JSON."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except ValueError:
                    return None
    return None


def known_label(label: object, allowed: Collection[str]) -> str:
    """`label`, when it names a route or the default route (`allowed`); else BadRecord."""
    if not isinstance(label, str):
        raise TypeError("label")  # a record of the wrong shape (read_records names the line)
    if label not in allowed:
        raise BadRecord(f"label {label!r} is not a route or the default route ({sorted(allowed)})")
    return label
