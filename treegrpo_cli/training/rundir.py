"""A training run folder: everything a run writes lives under one relocatable directory.

RUN/run.json          format, version, command, resolved config
RUN/metrics.jsonl     one JSON row per iteration
RUN/eval.jsonl        held-out reward (ODE samples of the eval prompts) before and after training
RUN/reward.png        reward against iteration and against wall time
RUN/samples/step-N.png  captioned ODE samples of the eval prompts (step-0: the base model)
RUN/before_after.png  the same eval prompts and noises: base model left, trained model right
RUN/checkpoints/step-N/ see store/checkpoint.py
RUN/.lock             held (flock) by the one process that writes the run; the OS drops it when that process dies
RUN/error-*.txt       the traceback of an internal error (a bug), named by the error line
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..config import Config, config_from_dict
from ..errors import ConfigError, TreegrpoError
from ..plots import band_chart, headed, image_grid, save_png, side_by_side
from ..rewards.base import weighted_sum
from ..rewards.plugins import RECORD, check_file_record, file_record
from ..store.checkpoint import problem
from ..store.safeio import contained, loads_json
from ..store.shards import atomic_write
from .runlock import LOCK
from .runlog import (
    EVALS,
    METRICS,
    EvalRow,
    MetricsRow,
    dangling_note,
    heldout_summary,
    is_number,
    read_evals,
    read_metrics,
    stall_runs,
    tenth_means,
)
from .sampling import sample_chunks, sample_trees, score, stream_seed

FORMAT = "treegrpo-run"
VERSION = 1
RUN_JSON = "run.json"
CHECKPOINTS = "checkpoints"


# --- the code that writes a run ----------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str | None]:
    """This treegrpo's version and, when the package is a git checkout, its commit (else None)."""
    pkg = Path(__file__).resolve().parents[1]
    commit = None
    try:
        r = subprocess.run(
            ["git", "-C", str(pkg), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        lines = r.stdout.split()
        # the package's own checkout only (not a git repository that happens to hold an installed copy)
        if r.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == pkg.parent:
            commit = lines[1]
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {"version": __version__, "commit": commit}


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
    return {"count": len(prompts), "sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest()}


# Keys a resumed run may change: they extend it or change how it is run, not what it learns.
RESUMABLE = {
    "train.iterations",
    "train.log",
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
    "policy.cudnn_attention",
    "policy.attention",
    "policy.compile",
    "policy.checkpoint_blocks",
}


def resume_config(run: Path, sets: list[str]) -> Config:
    """The run's config with `sets` applied; a set that would change what the run learns is refused."""
    stored = load_config(run)
    cfg = config_from_dict(stored.to_dict(), sets)
    a, b = _flat(stored.to_dict()), _flat(cfg.to_dict())
    for key in sorted(k for k in a if a[k] != b.get(k) and k not in RESUMABLE):
        raise ConfigError(
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
    info = read_info(run)
    rec = info.get("prompts", {}).get(kind)
    if rec and rec != prompt_record(prompts):
        source = info["config"].get("rollout", {}).get("prompts" if kind == "train" else "eval_prompts", "?")
        raise TreegrpoError(
            f"the {kind} prompts ({source}) changed since {run} started: {rec['count']} prompts with "
            f"sha256 {rec['sha256'][:12]}... then, {len(prompts)} with "
            f"{prompt_record(prompts)['sha256'][:12]}... now; restore them or start a new run"
        )


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
    now = _flat(loads_json(json.dumps(cfg.to_dict())))
    good, _ = scan_checkpoints(run)
    for path in reversed(good):
        then = _checkpoint_config(path)
        if then is None:
            continue
        flat = _flat(then)
        for key in sorted(k for k in flat if k in now and k not in RESUMABLE and flat[k] != now[k]):
            raise TreegrpoError(
                f"{run / RUN_JSON} says {key} = {json.dumps(now[key])} but checkpoint {path.name} was trained "
                f"with {json.dumps(flat[key])}; restore run.json's settings or start a new run"
            )


def reward_plot(run: Path) -> None:
    """reward.png: the training reward (the mean over an iteration's samples, their std as a band) and the
    held-out reward (eval.jsonl: the EMA and the trained weights where both are evaluated), against the
    iteration (left) and wall-clock minutes of training (right); a ring at every measured point."""
    rows = [r for r in read_metrics(run) if is_number(r.get("reward_mean")) and is_number(r.get("wall"))]
    if not rows:  # a staged update's row has neither
        return
    evals = read_evals(run)
    panels = [
        _reward_panel(rows, evals, False, "reward by iteration", "iteration (weights after N updates)"),
        _reward_panel(rows, evals, True, "reward by wall-clock time", "minutes of training"),
    ]
    save_png(side_by_side(panels), run / "reward.png")


def reward_band(rows: list[MetricsRow]) -> tuple[list[float], list[float]]:
    """(low, high) of reward.png's training band: each iteration's mean ± std of its leaves' rewards, clipped to
    the lowest and highest reward it saw (reward_min, reward_max; rows written before those were kept: unclipped),
    so that a reward capped at 1 never draws its band above 1."""
    low, high = [], []
    for r in rows:
        m = float(r["reward_mean"])
        d = float(r["reward_std"]) if is_number(r.get("reward_std")) else float("nan")
        lo, hi = r.get("reward_min"), r.get("reward_max")
        low.append(max(m - d, float(lo)) if is_number(lo) else m - d)
        high.append(min(m + d, float(hi)) if is_number(hi) else m + d)
    return low, high


def _reward_panel(rows: list[MetricsRow], evals: list[EvalRow], minutes: bool, title: str, xlabel: str):
    walls = {r["iteration"]: r["wall"] for r in rows}

    def x(row: MetricsRow | EvalRow, held_out: bool) -> float:
        if not minutes:
            return float(row["iteration"])
        wall = row.get("wall")
        if held_out and not is_number(wall):  # an evaluation without its own: the iteration before it
            wall = walls.get(row["iteration"] - 1, 0.0)
        return float(wall or 0.0) / 60

    xs, mean = [x(r, False) for r in rows], [float(r["reward_mean"]) for r in rows]
    training = "training reward (mean ± std of its samples)"
    bands = {training: (xs, mean, *reward_band(rows))}
    marks = {training: list(zip(xs, mean, strict=True)) if len(rows) <= 60 else []}
    ema = any(is_number(e.get("raw/reward_mean")) for e in evals)

    def used(e: EvalRow) -> float | None:  # the weights `eval` uses: the EMA where there is one
        return e.get("reward_mean")

    def trained(e: EvalRow) -> float | None:
        return e.get("raw/reward_mean")

    curves = {"held-out, EMA": used, "held-out, trained": trained} if ema else {"held-out": used}
    for name, get in curves.items():
        points = sorted((x(e, True), float(y)) for e in evals if is_number(y := get(e)))
        ys = [y for _, y in points]
        bands[name] = ([p for p, _ in points], ys, ys, ys)
        marks[name] = points
    return band_chart(bands, title, xlabel, "reward", marks=marks, integer_x=not minutes)


def sample_grid(
    run: Path, policy, sde, prompts: list[str], rewards: dict, *, cfg: Config, step: int, write: bool = True
) -> Path:
    """ODE samples (no noise after the root) of up to 16 eval prompts from the "grid" seed stream (sampling.py),
    captioned with their reward (write=False: the forwards only, for the other ranks of a sharded model)."""
    prompts, seed = prompts[:16], stream_seed(cfg.seed, "grid")
    batch, max_batch = max(len(prompts), 1), cfg.rollout.max_batch  # one rollout
    path = run / "samples" / f"step-{step}.png"
    if not write:
        for _ in sample_trees(policy, sde, prompts, seed, batch=batch, max_batch=max_batch):
            pass
        return path
    chunks = list(sample_chunks(policy, sde, prompts, seed, batch=batch, max_batch=max_batch))
    images = torch.cat([c.images for c in chunks])
    total = torch.cat([weighted_sum(score(rewards, c), cfg.reward.weight_map()) for c in chunks])
    captions = [f"{p} ({float(s):.3f})" for p, s in zip(prompts, total, strict=True)]
    what = "the base model" if step == 0 else f"after {step} iteration{'s' * (step != 1)} (trained weights)"
    random = str(getattr(policy, "weights", "")).startswith("random")
    lines = [f"{policy.name}: {what}"] + (["random weights, not a trained release"] if random else [])
    path.parent.mkdir(exist_ok=True)
    save_png(headed(image_grid(images, captions), lines), path)
    return path


def before_after(run: Path, step: int) -> Path | None:
    """before_after.png from samples/step-0.png and samples/step-<step>.png (None when either is missing), each
    titled with its held-out mean reward (eval.jsonl, where the run evaluated at that iteration)."""
    from PIL import Image

    paths = [run / "samples" / f"step-{k}.png" for k in (0, step)]
    if step == 0 or not all(p.is_file() for p in paths):
        return None
    before, after = (Image.open(p).convert("RGB") for p in paths)
    means = {e["iteration"]: e["reward_mean"] for e in read_evals(run) if is_number(e.get("reward_mean"))}

    def said(k: int) -> list[str]:
        return [f"held-out mean reward {means[k]:.4f}"] if k in means else []

    out = run / "before_after.png"
    sides = [
        headed(before, ["before: the base model", *said(0)]),
        headed(after, [f"after {step} iterations", *said(step)]),
    ]
    save_png(side_by_side(sides), out)
    return out


def missing_pictures(run: Path, step: int) -> Path | None:
    """reward.png and before_after.png when a finished run's last try stopped before writing them; the
    before_after.png it wrote, if any."""
    if not (run / "reward.png").is_file():
        reward_plot(run)
    return before_after(run, step) if not (run / "before_after.png").is_file() else None


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
        "minutes": (rows[-1].get("wall", 0.0) / 60) if rows else 0.0,
        "rollout_evals_per_leaf": rows[-1].get("rollout_evals_per_leaf", 0.0) if rows else 0.0,
        "train_evals_per_leaf": rows[-1].get("train_evals_per_leaf", 0.0) if rows else 0.0,
        **heldout_summary(read_evals(run)),
        **({"resume_command": resume_command(run)} if stopped else {}),
    }


def resume_command(run: Path) -> str:
    return f"treegrpo train --resume {shlex.quote(str(run))}"
