"""A short view of a training run folder (run.json, written by `treegrpo train`): what `treegrpo inspect` shows
of a run, where its usual argument is a tree folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..training import rundir
from ..training.runlog import heldout_summary, is_number, read_evals, read_metrics


def is_run_folder(path: Path) -> bool:
    """A folder with a run.json: `treegrpo train` wrote it (checked in full by inspect_run)."""
    return Path(path).is_dir() and (Path(path) / rundir.RUN_JSON).exists()


def inspect_run(run: Path) -> dict[str, Any]:
    """{"run_dir", "command", "config", "model", "rewards", "iterations" (done), "planned_iterations",
    "last_checkpoint" (None when none is complete), "checkpoint_step", "minutes" (of training), heldout_before /
    heldout_after / heldout_gain (where evaluated), guard / best_checkpoint (where the guard fired or kept one)};
    run.json, metrics.jsonl and eval.jsonl checked as `train --resume` checks them."""
    run = Path(run)
    info = rundir.read_info(run)
    cfg = rundir.load_config(run)
    rundir.check_layout(run)
    rows, evals = read_metrics(run), read_evals(run)
    good, _ = rundir.scan_checkpoints(run)
    wall = rows[-1].get("wall") if rows else None
    return {
        "run_dir": str(run),
        "command": info.get("command"),
        "config": cfg.name,
        "model": cfg.model,
        "rewards": list(cfg.reward.names),
        "iterations": len(rows),
        "planned_iterations": cfg.train.iterations,
        "last_checkpoint": str(good[-1]) if good else None,
        "checkpoint_step": int(good[-1].name[5:]) if good else None,
        "minutes": float(wall) / 60 if is_number(wall) else None,
        **heldout_summary(evals),
        **rundir.guard_summary(run, evals),  # guard: where a rule fired; best_checkpoint: RUN/best/step-N
    }
