"""Prompt lists with their metadata: the files and folders a user brings, and the built-in lists.

    .txt (or no suffix)   one prompt per line
    .jsonl                one object per line with a "prompt" string; every other field is the prompt's metadata
    .json                 a list of such objects (or of strings)
    .csv, .tsv            a header row with a `prompt` column; the other columns are metadata
    .parquet              a table with a `prompt` column (needs pyarrow: the `data` extra)
    FOLDER                a dataset written by `datasets.Dataset.save_to_disk` (the `data` extra)

A prompt is a `Prompt`: the text itself (a str, so every consumer of prompt text takes it as it is) with `.meta`,
the record's other fields (JSON values). The metadata travels with its prompt into tree folders, run folders
and every reward call (`prompt_meta`): a GenEval-style rule (the objects, counts, colours and positions asked
for) or OCR's target text can be given per prompt. `run_prompts` gives a run's training and held-out lists,
the held-out ones from their own file or split from the training file with the seed.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import random
from pathlib import Path
from typing import Any

from .engine.prompt import Prompt, prompt_meta
from .errors import TreegrpoError, shown
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
__all__ = [
    "Prompt",
    "prompt_meta",
    "load_prompts",
    "run_prompts",
    "held_out_prompts",
    "split_prompts",
    "take",
    "BUILTIN",
]
FORMATS = ".txt, .jsonl, .json, .csv, .tsv, .parquet, or a folder written by datasets' save_to_disk"
MAX_RECORDS = 1_000_000  # prompts in one file
MAX_META_BYTES = 65_536  # one prompt's metadata, as JSON


def load_prompts(path: Path | str | None = None) -> list[str]:
    """The prompts of a file, a dataset folder or a built-in list (see BUILTIN); the default list when None. Each
    is a Prompt (a str with its record's metadata)."""
    if path is None or str(path) in BUILTIN:
        path = BUILTIN[str(path or "default")]
    path = Path(path)
    if not os.path.lexists(path):
        raise TreegrpoError(f"prompts file not found: {path}{_builtin_hint(str(path))}")
    if path.is_dir():
        rows: list[Any] = _dataset_rows(path)
    elif path.suffix in ("", ".txt"):
        rows = [line.strip() for line in read_text(path, "prompts file").splitlines()]
        rows = [r for r in rows if r]
    elif path.suffix in READERS:
        rows = READERS[path.suffix](path)
    else:
        raise TreegrpoError(f"{path}: {shown(path.suffix)} is not a prompts format; use {FORMATS}")
    if len(rows) > MAX_RECORDS:
        raise TreegrpoError(f"{path}: {len(rows):,} prompts, more than the {MAX_RECORDS:,} a file may hold")
    prompts: list[str] = [_prompt(row, f"{path}: prompt {n}") for n, row in enumerate(rows, 1)]
    if not prompts:
        raise TreegrpoError(f"{path}: no prompts in the file")
    return prompts


def _prompt(row: Any, where: str) -> Prompt:
    """One record as a Prompt: a string, or an object with a non-empty "prompt" string and JSON metadata."""
    if isinstance(row, str):
        if not row.strip():
            raise TreegrpoError(f"{where}: an empty prompt")
        return Prompt(row.strip())
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise TreegrpoError(f'{where}: expected an object with a non-empty "prompt" string, got {shown(row, 80)}')
    meta = {str(k): v for k, v in row.items() if k != "prompt"}
    try:
        size = len(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TreegrpoError(f"{where}: metadata that is not JSON ({shown(str(e), 120)})") from None
    if size > MAX_META_BYTES:
        raise TreegrpoError(f"{where}: {size:,} bytes of metadata, more than {MAX_META_BYTES:,}")
    return Prompt(row["prompt"].strip(), meta)


def _jsonl_rows(path: Path) -> list[Any]:
    rows = []
    for n, line in enumerate(read_text(path, "prompts file").splitlines(), 1):
        if line.strip():
            try:
                rows.append(loads_json(line))
            except ValueError:
                raise TreegrpoError(f"{path}:{n}: not valid JSON") from None
            if not isinstance(rows[-1], dict):
                raise TreegrpoError(f'{path}:{n}: expected an object with a non-empty "prompt" string')
    return rows


def _json_rows(path: Path) -> list[Any]:
    try:
        rows = loads_json(read_text(path, "prompts file"))
    except ValueError as e:
        raise TreegrpoError(f"{path}: not valid JSON ({shown(str(e), 120)})") from None
    if not isinstance(rows, list):
        raise TreegrpoError(f'{path}: expected a list of prompts (objects with a "prompt" string, or strings)')
    return rows


def _table_rows(path: Path) -> list[Any]:
    """A .csv or .tsv with a header row; `prompt` is the text, the other columns metadata (strings)."""
    text = read_text(path, "prompts file")
    try:
        reader = csv.DictReader(io.StringIO(text), delimiter="\t" if path.suffix == ".tsv" else ",")
        if reader.fieldnames is None or "prompt" not in reader.fieldnames:
            found = ", ".join(map(repr, reader.fieldnames or []))[:200]
            raise TreegrpoError(f"{path}: its header has no `prompt` column (found {found or 'no header'})")
        rows = [{k: v for k, v in r.items() if k is not None} for r in reader]
    except csv.Error as e:
        raise TreegrpoError(f"{path}: not a readable {path.suffix[1:].upper()} file ({e})") from None
    return [dict(r, prompt=r.get("prompt") or "") for r in rows]


def _parquet_rows(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TreegrpoError(f"{path}: reading .parquet needs pyarrow: pip install 'treegrpo[data]'") from None
    try:
        return list(pq.read_table(path).to_pylist())
    except Exception as e:  # pyarrow's own error types
        raise TreegrpoError(f"{path}: not a readable parquet file ({shown(str(e), 160)})") from None


def _dataset_rows(path: Path) -> list[Any]:
    """The rows of a folder written by datasets' save_to_disk (one Dataset; a DatasetDict names its splits)."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise TreegrpoError(f"{path}: a dataset of splits ({', '.join(splits)}); give one, e.g. {path / splits[0]}")
    if not (path / "state.json").is_file():
        raise TreegrpoError(f"{path} is not a regular file nor a saved dataset (no state.json); use {FORMATS}")
    try:
        import datasets
    except ImportError:
        raise TreegrpoError(f"{path}: reading a saved dataset needs datasets: pip install 'treegrpo[data]'") from None
    try:
        return list(datasets.load_from_disk(str(path)).to_list())
    except Exception as e:  # datasets' and pyarrow's own error types
        raise TreegrpoError(f"{path}: not a readable saved dataset ({shown(str(e), 160)})") from None


READERS = {".jsonl": _jsonl_rows, ".json": _json_rows, ".csv": _table_rows, ".tsv": _table_rows}
READERS[".parquet"] = _parquet_rows


def _builtin_hint(name: str) -> str:
    """Of a --prompts that is no file: the built-in lists it is close to (general -> general-train, general-test),
    or, for a bare name, every built-in list."""
    close = difflib.get_close_matches(name, BUILTIN, n=3, cutoff=0.6) if len(name) < 100 else []
    if close:
        return f"; did you mean the built-in list {' or '.join(repr(c) for c in close)}?"
    if "/" not in name and "." not in name:
        return f" (nor a built-in list: {', '.join(BUILTIN)})"
    return ""


def split_prompts(prompts: list[str], split: float, seed: int) -> tuple[list[str], list[str]]:
    """(training, held out): `split` prompts (a whole count >= 1, or a share in (0, 1) of the list) drawn with the
    seed and held out; both keep the file's order."""
    n = len(prompts)
    k = int(split) if split >= 1 else round(split * n)
    if split != int(split) and split >= 1:
        raise TreegrpoError(f"rollout.eval_split must be a whole count >= 1 or a share in (0, 1), got {split}")
    if not 1 <= k < n:
        raise TreegrpoError(
            f"rollout.eval_split = {split:g} holds out {k} of {n} prompts; it must leave at least one on each side"
        )
    held = set(random.Random(f"eval-split:{seed}").sample(range(n), k))
    return [p for i, p in enumerate(prompts) if i not in held], [p for i, p in enumerate(prompts) if i in held]


def run_prompts(prompts: str, eval_prompts: str, eval_split: float, seed: int) -> tuple[list[str], list[str]]:
    """A run's (training, held-out) prompts: rollout.prompts and rollout.eval_prompts, or, with eval_split,
    both from rollout.prompts (split_prompts)."""
    train = load_prompts(prompts)
    if eval_split:
        return split_prompts(train, eval_split, seed)
    return train, load_prompts(eval_prompts)


def held_out_prompts(prompts: str, eval_prompts: str, eval_split: float, seed: int) -> list[str]:
    """A run's held-out prompts alone (run_prompts' second list; the training file is read only to split it)."""
    if eval_split:
        return split_prompts(load_prompts(prompts), eval_split, seed)[1]
    return load_prompts(eval_prompts)


def take(prompts: list[str], n: int) -> list[int]:
    """Prompt ids of the first n prompts, cycling through the list when n exceeds it."""
    if n < 1:
        raise TreegrpoError(f"--num-prompts must be >= 1, got {n}")
    return [i % len(prompts) for i in range(n)]
