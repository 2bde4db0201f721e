"""A training run folder: everything a run writes lives under one relocatable directory.

RUN/run.json          format, version, command, resolved config
RUN/metrics.jsonl     one JSON row per iteration
RUN/eval.jsonl        held-out reward (ODE samples of the eval prompts) before and after training
RUN/reward.png        reward against iteration and against wall time (runplots.py)
RUN/samples/step-N.png  captioned ODE samples of the eval prompts (step-0: the base model; grids.py)
RUN/before_after.png  the same eval prompts and noises: base model left, trained model right (grids.py)
RUN/checkpoints/step-N/ see store/checkpoint.py
RUN/best/step-N/      the checkpoint of the best held-out evaluation by guard.best (training/guard.py)
RUN/.lock             held (flock) by the one process that writes the run; the OS drops it when that process dies
RUN/error-*.txt       the traceback of an internal error (a bug), named by the error line

This module is the layout: the names, creating run.json and reading it back checked, the checkpoints folder, and
the summary of a run. What a resume checks is resumecheck.py; the code that wrote a run, provenance.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from ..config import Config, config_from_dict
from ..engine.prompt import prompt_meta
from ..errors import ConfigError, TreegrpoError
from ..rewards.plugins import RECORD, file_record
from ..store.checkpoint import list_checkpoints, problem
from ..store.safeio import contained, loads_json
from ..store.shards import atomic_write
from .provenance import code_version
from .runlock import LOCK
from .runlog import (
    EVALS,
    METRICS,
    dangling_note,
    heldout_summary,
    is_number,
    read_evals,
    read_metrics,
    stall_runs,
    tenth_means,
)

FORMAT = "treegrpo-run"
VERSION = 1
RUN_JSON = "run.json"
CHECKPOINTS = "checkpoints"
BEST = "best"  # RUN/best/step-N: the checkpoint of the best held-out evaluation by guard.best


def check_new(run: Path) -> None:
    """A new run may not reuse a folder that holds another run (or is a file)."""
    if (run / RUN_JSON).exists() or (run / METRICS).exists():
        raise TreegrpoError(
            f"{run} already holds a run; pass --resume {run} to continue it, or choose another --run-dir"
        )
    if run.exists() and not run.is_dir():
        raise TreegrpoError(f"{run} exists and is not a folder")
    if run.is_dir() and any(not _leftover(p.name) for p in run.iterdir()):
        raise TreegrpoError(f"{run} is not empty and holds no treegrpo run; choose a new or empty --run-dir")


def _leftover(name: str) -> bool:
    """What a run that failed before its first file leaves: its lock and an internal error's traceback file
    (the same command may use the folder again)."""
    return name == LOCK or (name.startswith("error-") and name.endswith(".txt"))


def create(
    run: Path,
    cfg: Config,
    command: str,
    prompts: dict[str, list[str]] | None = None,
    setup: dict[str, Any] | None = None,
) -> None:
    """run.json: the command, the resolved config, the code (version, commit), by content hash the prompt lists
    the run uses, and `setup` (the device and the model as loaded). The caller holds the run's lock
    (`lock(run, create=True)`)."""
    check_new(run)
    run.mkdir(parents=True, exist_ok=True)
    info = {
        "format": FORMAT,
        "version": VERSION,
        "command": command,
        "created": time.time(),
        "treegrpo": code_version(),
        "config": cfg.to_dict(),
        "prompts": {k: prompt_record(v) for k, v in (prompts or {}).items()},
        **({RECORD: files} if (files := file_record(cfg.reward.names)) else {}),  # a resume checks them
        **(setup or {}),
    }
    atomic_write(run / RUN_JSON, (json.dumps(info, indent=1) + "\n").encode())


def prompt_record(prompts: list[str]) -> dict[str, Any]:
    """A prompt list's count and sha256: of its texts, and of each prompt's metadata too when any has some (a
    resume checks both)."""
    text = "\n".join(prompts)
    if any(prompt_meta(p) for p in prompts):
        text += "\n" + "\n".join(json.dumps(prompt_meta(p), sort_keys=True) for p in prompts)
    return {"count": len(prompts), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def load_config(run: Path) -> Config:
    """The resolved config of an existing run, after checking that the folder is a treegrpo run."""
    info = read_info(run)
    try:
        return config_from_dict(info["config"])
    except ConfigError as e:
        raise ConfigError(f"{run / RUN_JSON}: config: {e}") from None


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number"
    )


def read_info(run: Path) -> dict[str, Any]:
    """run.json of an existing run, every field checked (a damaged one is named, with its file)."""
    path = run / RUN_JSON
    if not run.is_dir():
        raise TreegrpoError(f"{run}: no such run folder")
    if not path.is_file():
        if os.path.lexists(path):
            raise TreegrpoError(f"{path}: not a regular file")
        raise TreegrpoError(f"{run}: no {RUN_JSON}; not a treegrpo run folder")
    contained(run, path, f"run {run}")
    try:
        info = loads_json(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise TreegrpoError(f"{path}: not valid JSON") from None
    except OSError as e:
        raise TreegrpoError(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise TreegrpoError(
            f"{path}: not a treegrpo run (format {info.get('format') if isinstance(info, dict) else '?'!r})"
        )
    version = info.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TreegrpoError(f"{path}: version is {version!r} ({_kind(version)}), not a run format number")
    if version != VERSION:
        raise TreegrpoError(f"{path}: run format version {version} (this treegrpo reads version {VERSION})")
    _check_fields(path, info)
    return info


def _check_fields(path: Path, info: dict[str, Any]) -> None:
    """run.json's fields past its format and version: each of the type a run writes."""
    if "config" not in info:
        raise TreegrpoError(f"{path}: no config (the run's settings); the file is damaged")
    if not isinstance(info["config"], dict):
        raise TreegrpoError(f"{path}: config is {_kind(info['config'])}, not an object of settings")
    for key in ("command",):
        if key in info and not isinstance(info[key], str):
            raise TreegrpoError(f"{path}: {key} is {_kind(info[key])}, not a string")
    if "created" in info and not is_number(info["created"]):
        raise TreegrpoError(f"{path}: created is {_kind(info['created'])}, not a number")
    code = info.get("treegrpo")
    if code is not None and (
        not isinstance(code, dict) or not all(isinstance(code.get(k), (str, type(None))) for k in ("version", "commit"))
    ):
        raise TreegrpoError(f"{path}: treegrpo must be an object with a version and a commit, got {code!r}")
    prompts = info.get("prompts", {})
    if not isinstance(prompts, dict):
        raise TreegrpoError(f"{path}: prompts is {_kind(prompts)}, not an object")
    for kind, rec in prompts.items():
        if kind not in ("train", "eval"):
            raise TreegrpoError(f"{path}: prompts.{kind} is not a prompt list of a run (train, eval)")
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("count"), int)
            or isinstance(rec.get("count"), bool)
            or not isinstance(rec.get("sha256"), str)
        ):
            raise TreegrpoError(f"{path}: prompts.{kind} must be an object with a count and a sha256, got {rec!r}")


def check_layout(run: Path) -> None:
    """The run's files are files and its folders folders (not a symlink loop, not a folder in a file's place)."""
    for name in (RUN_JSON, METRICS, EVALS):
        p = run / name
        if os.path.lexists(p) and not p.is_file():
            raise TreegrpoError(f"{p}: not a regular file{dangling_note(p)}")
    for name in (CHECKPOINTS, "samples"):
        p = run / name
        if os.path.lexists(p) and not p.is_dir():
            raise TreegrpoError(f"{p}: not a folder{dangling_note(p)}")


def scan_checkpoints(run: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """(the complete checkpoints step-N, oldest first; (name, why) of every other entry of RUN/checkpoints).
    Names that start with a dot are a save's temporary folder (a process killed while saving) and are
    not listed."""
    folder = run / CHECKPOINTS
    if not folder.is_dir():
        return [], []
    good, other = [], []
    for p in sorted(folder.iterdir()):
        name = p.name
        if name.startswith("."):
            continue
        if not (name.startswith("step-") and name[5:].isdigit() and name[5:].isascii()):
            other.append((name, "not a checkpoint's name (step-N)"))
        elif p.is_symlink() or not p.is_dir():
            other.append((name, "not a folder"))
        elif not (p / "manifest.json").is_file():
            other.append((name, "no manifest.json (an incomplete or damaged checkpoint)"))
        elif (why := problem(p)) is not None:
            other.append((name, f"incomplete or damaged ({why.removeprefix(str(p) + '/').removeprefix(str(p))})"))
        else:
            good.append(p)
    return sorted(good, key=lambda p: int(p.name[5:])), other


def summary(run: Path, started_at: int, stopped: bool) -> dict[str, Any]:
    rows, evals = read_metrics(run), read_evals(run)
    first, last = tenth_means(rows)
    return {
        "run_dir": str(run),
        "iterations": len(rows),
        "resumed_from": started_at,
        "stopped_early": stopped,
        "stalled_iterations": stall_runs(rows),
        "reward_first_tenth": first,
        "reward_last_tenth": last,
        "minutes": (rows[-1].get("wall", 0.0) / 60) if rows else 0.0,
        "rollout_evals_per_leaf": rows[-1].get("rollout_evals_per_leaf", 0.0) if rows else 0.0,
        "train_evals_per_leaf": rows[-1].get("train_evals_per_leaf", 0.0) if rows else 0.0,
        **heldout_summary(evals),
        **guard_summary(run, evals),
        **({"resume_command": resume_command(run)} if stopped else {}),
    }


def guard_summary(run: Path, evals: list[Any]) -> dict[str, Any]:
    """guard: each rule that fired, when first and how often ("stat:jpeg_kb first at iteration 24, then at 9 more
    evaluations up to 60"; the reasons are in eval.jsonl); best_checkpoint: RUN/best/step-N."""
    out: dict[str, Any] = {}
    when: dict[str, list[int]] = {}
    for r in evals:
        for rule in r.get("guard/fired", []):
            when.setdefault(rule, []).append(r["iteration"])
    if when:
        out["guard"] = [
            f"{rule} first at iteration {its[0]}"
            + (f", then at {len(its) - 1} more evaluations up to {its[-1]}" if len(its) > 1 else "")
            for rule, its in sorted(when.items(), key=lambda kv: (kv[1][0], kv[0]))
        ]
    best = list_checkpoints(run / BEST)
    if best:
        out["best_checkpoint"] = str(best[-1])
    return out


def best_checkpoint(run: Path) -> Path:
    """RUN/best/step-N: the checkpoint of the run's best held-out evaluation by guard.best."""
    done = list_checkpoints(Path(run) / BEST)
    if not done:
        raise TreegrpoError(
            f"{run}: no best checkpoint ({BEST}/step-N is kept when guard.best names a monitor: --monitor NAME, or "
            "--set guard.best=reward)"
        )
    return done[-1]


def resume_command(run: Path) -> str:
    return f"treegrpo train --resume {shlex.quote(str(run))}"
