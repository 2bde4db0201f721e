"""Prompt files: `.txt` (one prompt per line) or `.jsonl` (a `prompt` field per line)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .errors import TreegrpoError
from .store.safeio import loads_json, read_text

DATA = Path(__file__).parent / "data"
DEFAULT_PROMPTS = DATA / "prompts.txt"
BUILTIN = {
    "default": DEFAULT_PROMPTS,
    "shapes-train": DATA / "shapes_train.txt",
    "shapes-test": DATA / "shapes_test.txt",
    "shapes-pretrain": DATA / "shapes_pretrain.txt",
    "motion-train": DATA / "motion_train.txt",  # the moving-shapes world (world/motion.py split_motion_prompts)
    "motion-test": DATA / "motion_test.txt",
    "motion-pretrain": DATA / "motion_pretrain.txt",
    # general scenes for the released models (written for treegrpo, CC0): 64 to train on, 16 held out
    "general-train": DATA / "general_train.txt",
    "general-test": DATA / "general_test.txt",
}


def load_prompts(path: Path | str | None = None) -> list[str]:
    """The prompts of a file or of a built-in list (see BUILTIN); the default list when None."""
    if path is None or str(path) in BUILTIN:
        path = BUILTIN[str(path or "default")]
    path = Path(path)
    if not os.path.lexists(path):
        raise TreegrpoError(f"prompts file not found: {path}{_builtin_hint(str(path))}")
    text = read_text(path, "prompts file")  # a byte-order mark is not part of the first prompt
    if path.suffix == ".jsonl":
        prompts = [_jsonl_prompt(line, path, n) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise TreegrpoError(f"{path}: no prompts in the file")
    return prompts


def _builtin_hint(name: str) -> str:
    """Of a --prompts that is no file: the built-in lists it is close to (general -> general-train, general-test),
    or, for a bare name, every built-in list."""
    close = difflib.get_close_matches(name, BUILTIN, n=3, cutoff=0.6) if len(name) < 100 else []
    if close:
        return f"; did you mean the built-in list {' or '.join(repr(c) for c in close)}?"
    if "/" not in name and "." not in name:
        return f" (nor a built-in list: {', '.join(BUILTIN)})"
    return ""


def _jsonl_prompt(line: str, path: Path, n: int) -> str:
    try:
        row = loads_json(line)
    except ValueError:
        raise TreegrpoError(f"{path}:{n}: not valid JSON") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise TreegrpoError(f'{path}:{n}: expected an object with a non-empty "prompt" string')
    return row["prompt"].strip()


def take(prompts: list[str], n: int) -> list[int]:
    """Prompt ids of the first n prompts, cycling through the list when n exceeds it."""
    if n < 1:
        raise TreegrpoError(f"--num-prompts must be >= 1, got {n}")
    return [i % len(prompts) for i in range(n)]
