"""Run tracking beside the run folder: TensorBoard event files and Weights & Biases (`train.log`).

The run folder stays the source of truth. A tracker is fed from it: every metrics row (nested fields flattened
as `seconds/rollout`; lists and strings left out), every held-out evaluation (`heldout/...`), and the sample
grids and before_after.png as images, each at its iteration. What a tracker has been given is written down in
`tracking.json` (per tracker: the last metrics and held-out iterations, the images). A resume recomputes the
iterations after its checkpoint (bit for bit) and drops the evaluations after it: TensorBoard purges every
event from the checkpoint's step on (its restart marker) and is given them again, so its curves are the run
folder's; W&B cannot rewind an offline run, so it skips the steps it already has (the same values), and a
held-out point logged after the checkpoint stays there. A tracker added on resume is first given the history.

TensorBoard writes `tensorboard/` in the run folder (torch.utils.tensorboard; the `tensorboard` package).
W&B writes `wandb/` in the run folder, offline unless the user has set W&B up (WANDB_MODE, WANDB_API_KEY, or
`wandb login`'s entry in ~/.netrc: then as they set it up), one W&B run id per treegrpo run, in tracking.json.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import TreegrpoError
from ..store.safeio import loads_json
from ..store.shards import atomic_write
from . import runlog
from .runlog import EvalRow, MetricsRow

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # name -> the package it needs
STATE = "tracking.json"


def check_available(names: tuple[str, ...]) -> None:
    """One line naming the extra when a tracker's package is missing (before anything is written)."""
    for name in names:
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise TreegrpoError(
                f"train.log {name!r} needs the {TRACKERS[name]} package: pip install 'treegrpo[track]' "
                f"(or pip install {TRACKERS[name]})"
            )


def flat(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a row, nested dicts as a/b; booleans, strings, lists and None left out."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}/"))
        elif runlog.is_number(v) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


class _Tracker(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None: ...
    def image(self, tag: str, path: Path, step: int) -> None: ...
    def close(self) -> None: ...


class _TensorBoard:
    rewinds = True  # a resume purges what was logged from its checkpoint's step on

    def __init__(self, run: Path, state: dict[str, Any], config: dict[str, Any], resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        folder = run / "tensorboard"
        folder.mkdir(exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a folder it cannot write: an error here, not a thread's later
            pass
        purge = resume_step if resume_step is not None and state.get("started") else None
        self.writer = SummaryWriter(log_dir=str(run / "tensorboard"), purge_step=purge)
        if not state.get("started"):
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def image(self, tag: str, path: Path, step: int) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as im:
            self.writer.add_image(tag, np.asarray(im.convert("RGB")), step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    rewinds = False

    def __init__(self, run: Path, state: dict[str, Any], config: dict[str, Any], resume_step: int | None):
        import wandb

        state.setdefault("id", uuid.uuid4().hex[:12])
        setup = "WANDB_MODE" in os.environ or "WANDB_API_KEY" in os.environ or _wandb_login()
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "treegrpo"),
            name=run.name,
            id=state["id"],
            resume="allow",
            dir=str(run),
            config=config,
            mode=None if setup else "offline",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def image(self, tag: str, path: Path, step: int) -> None:
        import wandb

        self.run.log({tag: wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_login() -> bool:
    """Has the user run `wandb login` (an api.wandb.ai entry in ~/.netrc, or $NETRC)?"""
    import netrc

    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Tracking:
    """The run's trackers, fed from its rows; rank 0 only."""

    def __init__(self, run: Path, names: tuple[str, ...], config: dict[str, Any], resume_step: int | None = None):
        """resume_step: the checkpoint step a resumed run goes on from (None: a new run)."""
        check_available(names)
        self.run, self.path = run, run / STATE
        self.state: dict[str, dict[str, Any]] = _read_state(self.path)
        kinds: dict[str, type[_TensorBoard] | type[_Wandb]] = {"tensorboard": _TensorBoard, "wandb": _Wandb}
        self.trackers: dict[str, _Tracker] = {}
        self.notes: list[str] = []  # trackers dropped, for the loop to say (library code never prints)
        for n in names:
            st = self.state.setdefault(n, {"metrics": -1, "heldout": -1, "images": []})
            try:
                self.trackers[n] = kinds[n](run, st, config, resume_step)
            except Exception as e:  # an install that does not import, a folder it cannot write
                self._drop(n, "could not start", e)
                continue
            if resume_step is not None and kinds[n].rewinds:  # metrics rows and evaluations from the step on
                st["metrics"], st["heldout"] = min(st["metrics"], resume_step - 1), min(st["heldout"], resume_step - 1)
                st["images"] = [k for k in st["images"] if _step(k) < resume_step]
            st["started"] = True
        self._save()
        self.catch_up(resume_step)

    def catch_up(self, upto: int | None = None) -> None:
        """Give each tracker the run's rows and the sample grids up to step `upto` it has not had (a tracker
        added on resume, or rows written after the last save of tracking.json), in iteration order."""
        events: list[tuple[int, int, Callable[[], None]]]
        events = [(r["iteration"], 0, functools.partial(self.metrics, r)) for r in runlog.read_metrics(self.run)]
        events += [(r["iteration"], 1, functools.partial(self.heldout, r)) for r in runlog.read_evals(self.run)]
        for _, _, give in sorted(events, key=lambda e: (e[0], e[1])):
            give()
        samples = sorted((self.run / "samples").glob("step-*.png"), key=lambda p: _step(p.stem))
        for p in samples:
            if upto is None or _step(p.stem) <= upto:  # a grid after the checkpoint is drawn again
                self.image("samples", p, _step(p.stem))

    def metrics(self, row: MetricsRow) -> None:
        self._scalars("metrics", row, "")

    def heldout(self, row: EvalRow) -> None:
        self._scalars("heldout", row, "heldout/")

    def _scalars(self, kind: str, row: MetricsRow | EvalRow, prefix: str) -> None:
        it = int(row["iteration"])
        values = {f"{prefix}{k}": v for k, v in flat(row).items() if k != "iteration"}
        for name, tracker in list(self.trackers.items()):
            if it > self.state[name][kind] and self._guard(name, lambda t=tracker: t.scalars(values, it)):
                self.state[name][kind] = it
        self._save()

    def image(self, tag: str, path: Path, step: int) -> None:
        key = f"{tag}@{step}"
        for name, tracker in list(self.trackers.items()):
            todo = key not in self.state[name]["images"] and path.is_file()
            if todo and self._guard(name, lambda t=tracker: t.image(tag, path, step)):
                self.state[name]["images"].append(key)
        self._save()

    def _guard(self, name: str, call: Any) -> bool:
        """Run one tracker call; a tracker that fails is dropped (the run goes on without it, saying so)."""
        try:
            call()
        except Exception as e:
            self._drop(name, "failed", e)
            return False
        return True

    def _drop(self, name: str, what: str, e: BaseException) -> None:
        self.trackers.pop(name, None)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        self.notes.append(f"warning: train.log {name} {what} ({type(e).__name__}: {first}); the run goes on without it")

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def _save(self) -> None:
        atomic_write(self.path, (json.dumps(self.state, indent=1) + "\n").encode())

    def close(self) -> None:
        for name, tracker in list(self.trackers.items()):
            self._guard(name, tracker.close)


H = TypeVar("H")


def tracked(hooks: H, track: Tracking) -> H:
    """The loop's hooks (a dataclass), with every row, evaluation and image also given to the trackers."""
    base: Any = hooks

    def said() -> None:  # the trackers dropped so far, as notes
        for message in track.take_notes():
            base.note(message)

    def on_row(row: MetricsRow) -> None:
        track.metrics(row)
        said()
        base.on_row(row)

    def on_eval(row: EvalRow) -> None:
        track.heldout(row)
        said()
        base.on_eval(row)

    def on_image(tag: str, path: Path, step: int) -> None:
        track.image(tag, path, step)
        said()
        base.on_image(tag, path, step)

    said()

    return dataclasses.replace(base, on_row=on_row, on_eval=on_eval, on_image=on_image)


def _step(name: str) -> int:
    """The step of step-12 (a grid's file) or samples@12 (an image's record); -1 if none."""
    tail = name.replace("@", "-").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _read_state(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        state = loads_json(path.read_bytes())
    except (ValueError, OSError):
        raise TreegrpoError(
            f"{path}: not valid JSON; delete it to log the run's history to its trackers again"
        ) from None
    ok = isinstance(state, dict) and all(
        isinstance(v, dict)
        and isinstance(v.get("metrics", -1), int)
        and isinstance(v.get("heldout", -1), int)
        and isinstance(v.get("images", []), list)
        for v in state.values()
    )
    if not ok:
        raise TreegrpoError(f"{path}: not a tracking record; delete it to log the run's history to its trackers again")
    return state
