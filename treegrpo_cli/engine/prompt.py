"""A prompt as the engine and the rewards see it: its text (a str) and its record's other fields (`meta`).

Every consumer of prompt text takes a Prompt as the string it is; a reward that reads metadata (a GenEval-style
rule, OCR's target text) takes `prompt_meta(p)`, which is {} for a plain string.
"""

from __future__ import annotations

from typing import Any


class Prompt(str):
    """A prompt's text, with the other fields of its record as `meta` (a dict of JSON values)."""

    meta: dict[str, Any]

    def __new__(cls, text: str, meta: dict[str, Any] | None = None) -> Prompt:
        p = super().__new__(cls, text)
        p.meta = dict(meta or {})
        return p

    def __reduce__(self) -> tuple[Any, ...]:
        return Prompt, (str(self), self.meta)


def prompt_meta(prompt: str) -> dict[str, Any]:
    """The metadata of a prompt ({} for a plain string)."""
    return getattr(prompt, "meta", {})
