"""Export a training checkpoint in diffusers' own format (`treegrpo export`).

    OUT/pytorch_lora_weights.safetensors   LoRA runs: `pipe.load_lora_weights(OUT)` loads it
    OUT/transformer/ (or unet/)            full fine-tuning: `<Model>.from_pretrained(OUT / "transformer")`
    OUT/treegrpo_export.json               what was exported: run, step, EMA or not, base model, files

The EMA weights are exported when the checkpoint has them, unless asked otherwise. The files are written in a
dot-named folder beside OUT (`.OUT.export-PID`, treegrpo_export.json last) and renamed to OUT, so a killed
export leaves no OUT a reader takes as whole; the next export to OUT sweeps what it left. With --overwrite into
a folder that is not empty, treegrpo_export.json is removed first and moved in last.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TreegrpoError, disk_full, no_space
from ..models.registry import load_policy
from ..store import faults
from ..store.checkpoint import list_checkpoints, load_checkpoint
from ..store.shards import atomic_write
from . import rundir

EXPORT_JSON = "treegrpo_export.json"


@dataclass
class ExportRequest:
    run_dir: Path
    out: Path
    step: int | None = None  # None: the latest complete checkpoint
    ema: bool = True  # export the EMA weights when the checkpoint has them
    overwrite: bool = False
    device: str = "cpu"
    dtype: str | None = None  # the base model's weights (auto, bf16, fp32); None: the run's policy.dtype
    best: bool = False  # RUN/best/step-N (the guard's best held-out evaluation) instead of checkpoints/


def pick_checkpoint(run_dir: Path, step: int | None, best: bool = False) -> Path:
    if best:
        if step is not None:
            raise TreegrpoError("--best and --step both pick the checkpoint; give one")
        return rundir.best_checkpoint(run_dir)
    done = list_checkpoints(run_dir / "checkpoints")
    if not done:
        raise TreegrpoError(f"{run_dir}: no complete checkpoint under checkpoints/")
    if step is None:
        return done[-1]
    for path in done:
        if int(path.name[5:]) == step:
            return path
    raise TreegrpoError(f"{run_dir}: no checkpoint of step {step} (have: {', '.join(p.name[5:] for p in done)})")


def export_checkpoint(req: ExportRequest, note: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Write one checkpoint's weights as a diffusers LoRA file or model folder under req.out; `note` hears
    each stage (reading the checkpoint, loading the model, writing)."""
    cfg = rundir.load_config(req.run_dir)
    if req.out.exists() and not req.out.is_dir():
        raise TreegrpoError(f"{req.out} exists and is not a folder")
    if req.out.exists() and any(req.out.iterdir()) and not req.overwrite:
        raise TreegrpoError(f"{req.out} is not empty; pass --overwrite or choose another --out")
    path = pick_checkpoint(req.run_dir, req.step, req.best)
    note(f"reading {path}")
    ck = load_checkpoint(path)
    use_ema = req.ema and ck.ema is not None
    note(f"loading {cfg.model} on {req.device} (no text encoders) ...")
    opts = cfg.policy if req.dtype is None else dataclasses.replace(cfg.policy, dtype=req.dtype)
    opts.validate()  # a dtype of the request: auto, bf16 or fp32
    policy = load_policy(cfg.model, req.device, opts, text_encoders=False)
    if not hasattr(policy, "export"):
        raise TreegrpoError(
            f"model {cfg.model!r} has no diffusers format; its weights are the model-*.safetensors shards of {path}"
        )
    weights = ck.ema if use_ema else ck.model
    what = "LoRA" if cfg.policy.finetune == "lora" else "full"
    note(f"writing the {'EMA ' if use_ema else ''}{what} weights of step {ck.step} to {req.out} ...")
    stage = _stage(req.out)
    try:
        files = policy.export(stage, weights)
        faults.point("export.file")
        info = {
            "run_dir": str(req.run_dir),
            "checkpoint": str(path),
            "step": ck.step,
            "ema": use_ema,
            "model": policy.describe(),
            "files": files,
        }
        atomic_write(stage / EXPORT_JSON, (json.dumps(info, indent=1) + "\n").encode())
    except Exception as e:  # a full disk, however the library that wrote said it
        shutil.rmtree(stage, ignore_errors=True)
        if no_space(e):
            raise disk_full(req.out, sum(int(t.numel() * t.element_size()) for t in (weights or {}).values())) from None
        raise
    _commit(stage, req.out)
    return {"out": str(req.out), "step": ck.step, "ema": use_ema, "finetune": cfg.policy.finetune, "files": files}


def _stage(out: Path) -> Path:
    """A new, empty staging folder beside `out`; the staging folders of earlier, killed exports to it swept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f".{out.name}.export-*"):
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    stage = out.parent / f".{out.name}.export-{os.getpid()}"
    stage.mkdir()
    return stage


def _commit(stage: Path, out: Path) -> None:
    """The staged export becomes `out`: one rename into a new or empty folder; into a full one (--overwrite)
    entry by entry, its treegrpo_export.json removed first and moved in last."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(stage, out)
        return
    (out / EXPORT_JSON).unlink(missing_ok=True)
    for entry in sorted(stage.iterdir()):
        if entry.name == EXPORT_JSON:
            continue
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(entry, target)
        faults.point("export.file")
    os.replace(stage / EXPORT_JSON, out / EXPORT_JSON)
    stage.rmdir()
