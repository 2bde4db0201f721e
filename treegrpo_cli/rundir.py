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

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from .config import Config, config_from_dict
from .engine.rollout import TreeConfig, mix_seed, rollout
from .errors import TreegrpoError
from .plots import image_grid, line_chart, save_png, side_by_side, titled
from .rewards.base import score_leaves
from .store.shards import atomic_write

FORMAT = "treegrpo-run"
VERSION = 1
RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
EVALS = "eval.jsonl"


def check_new(run: Path) -> None:
    """A new run may not reuse a folder that holds another run (or is a file)."""
    if (run / RUN_JSON).exists() or (run / METRICS).exists():
        raise TreegrpoError(f"{run} already holds a run; pass --resume {run} to continue it, or choose another --run-dir")
    if run.exists() and not run.is_dir():
        raise TreegrpoError(f"{run} exists and is not a folder")


def create(run: Path, cfg: Config, command: str) -> None:
    check_new(run)
    run.mkdir(parents=True, exist_ok=True)
    info = {"format": FORMAT, "version": VERSION, "command": command, "created": time.time(), "config": cfg.to_dict()}
    atomic_write(run / RUN_JSON, (json.dumps(info, indent=1) + "\n").encode())


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
        raise TreegrpoError(f"{path}: not a treegrpo run (format {info.get('format') if isinstance(info, dict) else '?'!r})")
    if info.get("version") != VERSION:
        raise TreegrpoError(f"{path}: run format version {info.get('version')} (this treegrpo reads {VERSION})")
    return config_from_dict(info["config"])


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """Complete rows of metrics.jsonl (a torn last line from a killed process is ignored)."""
    path = run / METRICS
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def append_metrics(run: Path, row: dict[str, Any]) -> None:
    with open(run / METRICS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_evals(run: Path) -> list[dict[str, Any]]:
    path = run / EVALS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


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


def sample_grid(run: Path, policy, sde, prompts: list[str], rewards: dict, cfg: Config, step: int) -> Path:
    """ODE samples (no noise after the root) of up to 16 eval prompts, captioned with their reward."""
    prompts = prompts[:16]
    ode = TreeConfig(sde_steps=())
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), sde, ode, mix_seed(cfg.seed, 0xE7A1))
    with torch.no_grad():
        images = policy.decode(tree.image_latent).cpu()
    scores = score_leaves(rewards, images, prompts)
    weights = cfg.reward.weight_map()
    total = sum(w * scores[n] for n, w in weights.items())
    captions = [f"{p} ({float(s):.3f})" for p, s in zip(prompts, total)]
    path = run / "samples" / f"step-{step}.png"
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


def summary(run: Path, started_at: int, stopped: bool) -> dict[str, Any]:
    rows = read_metrics(run)
    first, last = tenth_means(rows)
    return {"run_dir": str(run), "iterations": len(rows), "resumed_from": started_at, "stopped_early": stopped,
            "reward_first_tenth": first, "reward_last_tenth": last,
            "minutes": (rows[-1]["wall"] / 60) if rows else 0.0,
            "rollout_evals_per_leaf": rows[-1]["rollout_evals_per_leaf"] if rows else 0.0,
            "train_evals_per_leaf": rows[-1]["train_evals_per_leaf"] if rows else 0.0,
            **_heldout_summary(read_evals(run))}


def _heldout_summary(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """heldout_before / heldout_after: the eval prompts' mean reward at the first and last evaluation."""
    if not evals:
        return {}
    out = {"heldout_before": evals[0]["reward_mean"], "heldout_before_iteration": evals[0]["iteration"]}
    if len(evals) > 1:
        out.update(heldout_after=evals[-1]["reward_mean"], heldout_after_iteration=evals[-1]["iteration"],
                   heldout_gain=evals[-1]["reward_mean"] - evals[0]["reward_mean"])
    return out
