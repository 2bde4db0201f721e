"""What a resume checks before it writes anything: the settings it may change (RESUMABLE), the prompts and the
files the run started with, every log row and checkpoint's settings against run.json's, and the code it
started under (a warning)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from ..config import Config, config_from_dict
from ..config.guard import GuardConfig
from ..errors import ConfigError, TreegrpoError
from ..rewards.plugins import RECORD, check_file_record
from ..store.safeio import loads_json
from .provenance import code_version
from .rundir import RUN_JSON, check_layout, load_config, prompt_record, read_info, scan_checkpoints
from .runlog import read_evals, read_metrics

# Keys a resumed run may change: they extend it or change how it is run, not what it learns.
RESUMABLE = {
    "train.iterations",
    "train.log",
    "train.parallel",
    "train.max_minutes",
    "train.eval_every",
    "train.eval_every_minutes",
    "train.max_tflops",
    "train.eval_every_tflops",
    "train.save_every",
    "train.keep_last",
    "train.sample_every",
    "rollout.max_batch",
    "policy.gradient_checkpointing",
    "policy.prompt_cache",
    "policy.free_text_encoders",
    "policy.cudnn_attention",
    "policy.attention",
    "policy.compile",
    "policy.checkpoint_blocks",
} | {f"guard.{f.name}" for f in dataclasses.fields(GuardConfig)}  # the guard watches; it changes nothing learnt


def resume_config(run: Path, sets: list[str]) -> Config:
    """The run's config with `sets` applied; a set that would change what the run learns is refused."""
    stored = load_config(run)
    cfg = config_from_dict(stored.to_dict(), sets)
    a, b = flat_keys(stored.to_dict()), flat_keys(cfg.to_dict())
    for key in sorted(k for k in a if a[k] != b.get(k) and k not in RESUMABLE):
        raise ConfigError(
            f"--resume keeps the run's settings: {key} is {a[key]!r} in {run / RUN_JSON}, "
            f"not {b.get(key)!r}; start a new run to change it"
        )
    return cfg


def flat_keys(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's nested settings by dotted key: {"train": {"iterations": 3}} -> {"train.iterations": 3}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_prompts(run: Path, kind: str, prompts: list[str]) -> None:
    """The prompts a resumed run loads are the ones it started with (same content)."""
    info = read_info(run)
    rec = info.get("prompts", {}).get(kind)
    if rec and rec != prompt_record(prompts):
        source = info["config"].get("rollout", {}).get("prompts" if kind == "train" else "eval_prompts", "?")
        raise TreegrpoError(
            f"the {kind} prompts ({source}) changed since {run} started: {rec['count']} prompts with "
            f"sha256 {rec['sha256'][:12]}... then, {len(prompts)} with "
            f"{prompt_record(prompts)['sha256'][:12]}... now; restore them or start a new run"
        )


def _checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The config a checkpoint recorded, when its trainer_state.json is intact (its sha256 matches the
    manifest); None otherwise (loading it will report the damage)."""
    try:
        manifest = loads_json((path / "manifest.json").read_bytes())
        data = (path / "trainer_state.json").read_bytes()
        if not isinstance(manifest, dict) or manifest.get("trainer_state.json") != hashlib.sha256(data).hexdigest():
            return None
        state = loads_json(data)
    except (OSError, ValueError):
        return None
    config = state.get("config") if isinstance(state, dict) else None
    return config if isinstance(config, dict) else None


def check_resumable(run: Path, cfg: Config) -> None:
    """Before a resume writes anything: the folder's layout, every metrics and held-out row, and the settings
    every intact checkpoint was trained with against run.json's (a key a resume may not change that differs:
    run.json was edited)."""
    check_layout(run)
    read_metrics(run)
    read_evals(run)
    if RECORD in (info := read_info(run)):  # the run's file rewards are the files it started with
        check_file_record(info[RECORD], cfg.reward.names, str(run / RUN_JSON))
    now = flat_keys(loads_json(json.dumps(cfg.to_dict())))
    good, _ = scan_checkpoints(run)
    for path in reversed(good):
        then = _checkpoint_config(path)
        if then is None:
            continue
        flat = flat_keys(then)
        for key in sorted(k for k in flat if k in now and k not in RESUMABLE and flat[k] != now[k]):
            raise TreegrpoError(
                f"{run / RUN_JSON} says {key} = {json.dumps(now[key])} but checkpoint {path.name} was trained "
                f"with {json.dumps(flat[key])}; restore run.json's settings or start a new run"
            )


def code_change(run: Path) -> str | None:
    """A warning when the run was started by another treegrpo version or commit than this one."""
    then = read_info(run).get("treegrpo")
    now = code_version()
    if then is None or then == now:
        return None

    def said(v: dict[str, Any]) -> str:
        return f"treegrpo {v.get('version')}" + (f" (commit {v['commit']})" if v.get("commit") else "")

    return (
        f"warning: {run} was started by {said(then)} and is resumed by {said(now)}; the resumed iterations "
        "may not repeat what the old code would have done"
    )
