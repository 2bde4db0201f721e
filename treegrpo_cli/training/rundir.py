"""A training run folder: everything a run writes lives under one relocatable directory.

RUN/run.json          format, version, command, resolved config
RUN/metrics.jsonl     one JSON row per iteration
RUN/eval.jsonl        held-out reward (ODE samples of the eval prompts) before and after training
RUN/reward.png        reward against iteration and against wall time
RUN/samples/step-N.png  captioned ODE samples of the eval prompts (step-0: the base model)
RUN/before_after.png  the same eval prompts and noises: base model left, trained model right
RUN/checkpoints/step-N/ see store/checkpoint.py
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config, config_from_dict
from ..engine.rollout import TreeConfig, mix_seed, rollout
from ..errors import TreegrpoError
from ..plots import image_grid, line_chart, save_png, side_by_side, titled
from ..rewards.base import score_leaves, weighted_sum
from ..store.shards import atomic_write

FORMAT = "treegrpo-run"
VERSION = 1
RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
EVALS = "eval.jsonl"


def check_new(run: Path) -> None:
    """A new run may not reuse a folder that holds another run (or is a file)."""
    if (run / RUN_JSON).exists() or (run / METRICS).exists():
        raise TreegrpoError(
            f"{run} already holds a run; pass --resume {run} to continue it, or choose another --run-dir"
        )
    if run.exists() and not run.is_dir():
        raise TreegrpoError(f"{run} exists and is not a folder")


def create(run: Path, cfg: Config, command: str, prompts: dict[str, list[str]] | None = None) -> None:
    """run.json: the command, the resolved config and, by content hash, the prompt lists the run uses."""
    check_new(run)
    run.mkdir(parents=True, exist_ok=True)
    info = {
        "format": FORMAT,
        "version": VERSION,
        "command": command,
        "created": time.time(),
        "config": cfg.to_dict(),
        "prompts": {k: prompt_record(v) for k, v in (prompts or {}).items()},
    }
    atomic_write(run / RUN_JSON, (json.dumps(info, indent=1) + "\n").encode())


def prompt_record(prompts: list[str]) -> dict[str, Any]:
    return {"count": len(prompts), "sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest()}


# Keys a resumed run may change: they extend it or change how it is run, not what it learns.
RESUMABLE = {
    "train.iterations",
    "train.parallel",
    "train.max_minutes",
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
}


def resume_config(run: Path, sets: list[str]) -> Config:
    """The run's config with `sets` applied; a set that would change what the run learns is refused."""
    stored = load_config(run)
    cfg = config_from_dict(stored.to_dict(), sets)
    a, b = _flat(stored.to_dict()), _flat(cfg.to_dict())
    for key in sorted(k for k in a if a[k] != b.get(k) and k not in RESUMABLE):
        raise TreegrpoError(
            f"--resume keeps the run's settings: {key} is {a[key]!r} in {run / RUN_JSON}, "
            f"not {b.get(key)!r}; start a new run to change it"
        )
    return cfg


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_prompts(run: Path, kind: str, prompts: list[str]) -> None:
    """The prompts a resumed run loads are the ones it started with (same content)."""
    info = json.loads((run / RUN_JSON).read_text())
    rec = info.get("prompts", {}).get(kind)
    if rec and rec != prompt_record(prompts):
        source = info["config"]["rollout"]["prompts" if kind == "train" else "eval_prompts"]
        raise TreegrpoError(
            f"the {kind} prompts ({source}) changed since {run} started: {rec['count']} prompts with "
            f"sha256 {rec['sha256'][:12]}... then, {len(prompts)} with "
            f"{prompt_record(prompts)['sha256'][:12]}... now; restore them or start a new run"
        )


def load_config(run: Path) -> Config:
    """The resolved config of an existing run, after checking that the folder is a treegrpo run."""
    path = run / RUN_JSON
    if not run.is_dir():
        raise TreegrpoError(f"{run}: no such run folder")
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise TreegrpoError(f"{run}: no {RUN_JSON}; not a treegrpo run folder") from None
    except ValueError:
        raise TreegrpoError(f"{path}: not valid JSON") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise TreegrpoError(
            f"{path}: not a treegrpo run (format {info.get('format') if isinstance(info, dict) else '?'!r})"
        )
    if info.get("version") != VERSION:
        raise TreegrpoError(f"{path}: run format version {info.get('version')} (this treegrpo reads {VERSION})")
    return config_from_dict(info["config"])


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl. A torn last line (no newline: the process was killed while writing it)
    is left out; a damaged line before it is an error, not a silent truncation."""
    return _read_jsonl(run / METRICS)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is empty or torn
    rows = []
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "iteration" not in row:
            raise TreegrpoError(
                f"{path}: line {n} is damaged ({line[:40]!r}); the rows after it would be lost — "
                f"repair or delete that line, then resume"
            )
        rows.append(row)
    return rows


def append_metrics(run: Path, row: dict[str, Any]) -> None:
    with open(run / METRICS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_evals(run: Path) -> list[dict[str, Any]]:
    return _read_jsonl(run / EVALS)


def append_eval(run: Path, row: dict[str, Any]) -> None:
    with open(run / EVALS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_evals(run: Path, step: int) -> None:
    """Keep the held-out evaluations made at or before iteration `step`."""
    rows = [r for r in read_evals(run) if r["iteration"] <= step]
    atomic_write(run / EVALS, "".join(json.dumps(r) + "\n" for r in rows).encode())


def truncate_metrics(run: Path, step: int) -> None:
    """Keep the rows of iterations before `step` (those after the checkpoint are recomputed)."""
    rows = [r for r in read_metrics(run) if r["iteration"] < step]
    atomic_write(run / METRICS, "".join(json.dumps(r) + "\n" for r in rows).encode())


def reward_plot(run: Path) -> None:
    rows = read_metrics(run)
    if not rows:
        return
    r = [row["reward_mean"] for row in rows]
    by_it = line_chart({"reward": ([row["iteration"] for row in rows], r)}, "mean reward", "iteration", "reward")
    by_time = line_chart({"reward": ([row["wall"] / 60 for row in rows], r)}, "mean reward", "minutes", "reward")
    save_png(side_by_side([by_it, by_time]), run / "reward.png")


def sample_grid(
    run: Path, policy, sde, prompts: list[str], rewards: dict, cfg: Config, step: int, write: bool = True
) -> Path:
    """ODE samples (no noise after the root) of up to 16 eval prompts, captioned with their reward
    (write=False: the forwards only, for the other ranks of a sharded model)."""
    prompts = prompts[:16]
    ode = TreeConfig(sde_steps=())
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), sde, ode, mix_seed(cfg.seed, 0xE7A1))
    path = run / "samples" / f"step-{step}.png"
    if not write:
        return path
    with torch.no_grad():
        images = policy.decode(tree.image_latent).cpu()
    scores = score_leaves(rewards, images, prompts)
    weights = cfg.reward.weight_map()
    total = weighted_sum(scores, weights)
    captions = [f"{p} ({float(s):.3f})" for p, s in zip(prompts, total, strict=True)]
    path.parent.mkdir(exist_ok=True)
    save_png(image_grid(images, captions), path)
    return path


def before_after(run: Path, step: int) -> Path | None:
    """before_after.png from samples/step-0.png and samples/step-<step>.png (None when either is missing)."""
    from PIL import Image

    paths = [run / "samples" / f"step-{k}.png" for k in (0, step)]
    if step == 0 or not all(p.is_file() for p in paths):
        return None
    before, after = (Image.open(p).convert("RGB") for p in paths)
    out = run / "before_after.png"
    save_png(side_by_side([titled(before, "before: the base model"), titled(after, f"after {step} iterations")]), out)
    return out


def tenth_means(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean reward of the first and of the last tenth of the iterations (at least one each)."""
    if not rows:
        return math.nan, math.nan
    k = max(1, len(rows) // 10)
    first = sum(r["reward_mean"] for r in rows[:k]) / k
    last = sum(r["reward_mean"] for r in rows[-k:]) / k
    return first, last


STALL_ITERATIONS = 5  # this many iterations in a row without a trained edge is worth a warning


def stalled(row: dict[str, Any]) -> bool:
    """No edge with a non-zero advantage was trained: every group tied, no gradient."""
    return row.get("trained_edges", 0) == 0 or row.get("adv_abs_max", 0.0) == 0.0


def stall_message(first: int, last: int) -> str:
    return (
        f"warning: iterations {first}-{last} trained nothing: every group's leaves scored the same, so no "
        "advantage and no gradient; the reward cannot tell the samples apart (collapsed model, saturated reward?)"
    )


def stall_runs(rows: list[dict[str, Any]]) -> list[list[int]]:
    """[first, last] iteration of every run of at least STALL_ITERATIONS stalled iterations."""
    runs, start = [], None
    for i, row in enumerate(rows + [{}]):
        if i < len(rows) and stalled(row):
            start = row["iteration"] if start is None else start
        else:
            if start is not None and rows[i - 1]["iteration"] - start + 1 >= STALL_ITERATIONS:
                runs.append([start, rows[i - 1]["iteration"]])
            start = None
    return runs


def summary(run: Path, started_at: int, stopped: bool) -> dict[str, Any]:
    rows = read_metrics(run)
    first, last = tenth_means(rows)
    return {
        "run_dir": str(run),
        "iterations": len(rows),
        "resumed_from": started_at,
        "stopped_early": stopped,
        "stalled_iterations": stall_runs(rows),
        "reward_first_tenth": first,
        "reward_last_tenth": last,
        "minutes": (rows[-1]["wall"] / 60) if rows else 0.0,
        "rollout_evals_per_leaf": rows[-1]["rollout_evals_per_leaf"] if rows else 0.0,
        "train_evals_per_leaf": rows[-1]["train_evals_per_leaf"] if rows else 0.0,
        **_heldout_summary(read_evals(run)),
    }


def _heldout_summary(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """heldout_before / heldout_after: the eval prompts' mean reward at the first and last evaluation."""
    if not evals:
        return {}
    out = {"heldout_before": evals[0]["reward_mean"], "heldout_before_iteration": evals[0]["iteration"]}
    if len(evals) > 1:
        out.update(
            heldout_after=evals[-1]["reward_mean"],
            heldout_after_iteration=evals[-1]["iteration"],
            heldout_gain=evals[-1]["reward_mean"] - evals[0]["reward_mean"],
        )
    return out
