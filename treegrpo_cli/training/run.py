"""One rank's whole life in `treegrpo train`: its process group, the run folder every rank agrees on, signals to a
stop flag, the loop (loop.py) and the teardown. It raises; the command prints.

    RunRequest    what the command asks for: preset, config file, --set items, prompts, run folder or resume
    Voice         what the run says through the command: its first lines and notes, progress, each iteration's
                  and held-out evaluation's row, the notice of a stop signal, and a rank's fatal error, said
                  before the process group goes (tearing gloo down can abort the process)
    StopFlag      SIGTERM and a first SIGINT ask for a stop after the current iteration (a second SIGINT
                  interrupts); a signal after the loop finds the run complete (`late`)
    start(req, voice) -> the run's summary (rank 0; {} on the other ranks)
    RunAborted    raised after a rank's fatal error was said and its process group torn down: the exit code
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, config_layers, load_config, user_warnings
from ..engine.rollout import Progress
from ..errors import TreegrpoError
from ..prompts import run_prompts
from . import dist, resumecheck, rundir
from .dist import Dist
from .guard import Features
from .loop import Hooks, TrainRequest
from .loop import train as train_loop
from .needs import check_train
from .runlog import EvalRow, MetricsRow

STOP_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as a shell reports it


@dataclass
class RunRequest:
    preset: str
    config: Path | None = None
    sets: list[str] = field(default_factory=list)  # --set items (and what train's options make of themselves)
    prompts: str | None = None  # --prompts: recorded in run.json as rollout.prompts
    run_dir: Path | None = None  # None: runs/<preset>-<time>
    resume: Path | None = None
    device: str = "cpu"
    command: str = ""
    features: Callable[[str, str], Features] | None = None  # guard.features' extractor (name, device); None: pixels


@dataclass
class Voice:
    note: Callable[[str], None] = lambda message: None  # a line of rank 0's
    progress: Progress = lambda phase, done, total: None
    on_row: Callable[[MetricsRow], None] = lambda row: None
    on_eval: Callable[[EvalRow], None] = lambda row: None
    on_run_folder: Callable[[Path], None] = lambda run: None  # the folder is known (before anything is written)
    stopping: Callable[[], None] = lambda: None  # the first stop signal came (called in the signal handler)
    fatal: Callable[[BaseException], None] = lambda error: None  # this rank's error, before the group goes


class RunAborted(Exception):
    """A rank's error, already said through Voice.fatal; the process group is gone."""

    def __init__(self, exit_code: int):
        super().__init__(exit_code)
        self.exit_code = exit_code


@dataclass
class StopFlag:
    stop: bool = False  # a stop after the current iteration was asked for
    signal: int | None = None  # the first stop signal
    done: bool = False  # the loop has returned: a signal from here on finds the run complete
    late: int | None = None  # a signal that came after the loop

    def exit_code(self) -> int:
        return STOP_CODES.get(int(self.signal or signal.SIGTERM), 143)


@contextmanager
def stop_signals(flag: StopFlag, stopping: Callable[[], None]) -> Iterator[StopFlag]:
    """SIGTERM or a first Ctrl-C ask the loop to stop after the current iteration (and checkpoint); a second Ctrl-C
    interrupts; after the loop a signal is noted as late. The handlers before come back after."""

    def ask(signum: int, frame: Any) -> None:
        if flag.done:
            flag.late = flag.late or signum
            return
        if flag.stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not flag.stop:
            flag.signal = signum
            stopping()
        flag.stop = True

    old = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def start(req: RunRequest, voice: Voice, flag: StopFlag) -> dict[str, Any]:
    """This rank's run: prepared (config, run folder, prompts, pre-flight), trained, its group torn down."""
    d = dist.from_env()
    if not d.active:
        return _train_rank(_prepare(req, voice, d), voice, flag)
    done = False
    try:
        summary = _train_rank(_prepare(req, voice, d), voice, flag)
        dist.barrier(d)  # every rank done before the group goes away
        done = True
        return summary
    except (TreegrpoError, KeyboardInterrupt, Exception) as e:
        voice.fatal(e)  # said before the group goes: tearing gloo down can abort the process
        raise RunAborted(getattr(e, "exit_code", 130 if isinstance(e, KeyboardInterrupt) else 1)) from None
    finally:
        sys.stderr.flush()
        dist.shutdown()  # a live gloo group at interpreter exit aborts the process
        if done and not d.main:  # rank 0 reports; the others leave now: gloo's threads can still be
            sys.stdout.flush()  # winding down, and the interpreter's teardown then aborts the process
            os._exit(0)  # ("terminate called without an active exception")


@dataclass
class _Prepared:
    request: TrainRequest
    header: list[str]  # the run's first lines, said once the run folder is this process's


def _prepare(req: RunRequest, voice: Voice, d: Dist) -> _Prepared:
    """The config (a new run's, or the resumed run's with its --set), the run folder every rank agrees on, the
    prompts, and every missing file named at once before anything is written."""
    from ..preflight import check_writable_dir

    sets = req.sets + ([f"rollout.prompts={json.dumps(req.prompts)}"] if req.prompts else [])  # into run.json
    if req.resume is not None:
        cfg, run = resumecheck.resume_config(req.resume, sets), req.resume
        warnings = cfg.new_warnings(rundir.load_config(req.resume))  # what --set adds to those the run said
    else:
        cfg = load_config(req.preset, req.config, sets)
        warnings = user_warnings(cfg, config_layers(req.preset, req.config, sets))
        default = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = Path(dist.gather(str(req.run_dir or default), d)[0])
    if d.main:  # the model, its files and every reward's: one line naming all that is missing, before any print
        check_train(cfg)
        for w in warnings:
            voice.note(w)
    if req.resume is None and d.main:
        rundir.check_new(run)
        check_writable_dir(run, "--run-dir")
    voice.on_run_folder(run)
    cfg, scaled = _scaled(cfg, d, new=req.resume is None)
    dist.shard(cfg.rollout.num_prompts, d)  # divisible by the processes, before anything is written
    r = cfg.rollout
    train_prompts, eval_prompts = run_prompts(r.prompts, r.eval_prompts, r.eval_split, cfg.seed)
    if req.resume is not None:
        resumecheck.check_prompts(run, "train", train_prompts)
        resumecheck.check_prompts(run, "eval", eval_prompts)
    g = cfg.guard
    space = g.features if g.enabled and g.diversity and g.features != "pixels" else None
    features = req.features(space, req.device) if space and req.features else None  # its weights: before any write
    request = TrainRequest(
        cfg, train_prompts, eval_prompts, run, req.resume is not None, req.device, req.command, d, features
    )
    given = {item.split("=", 1)[0].strip() for item in sets}
    header = [*run_header(cfg, req.device, req.resume is None, given), *scaled, f"run folder: {run}"]
    return _Prepared(request, header)


def _scaled(cfg: Config, d: Dist, new: bool) -> tuple[Config, list[str]]:
    """A new run's prompts an iteration rounded up to a multiple of the processes, and the line that says so."""
    n = dist.scaled_prompts(cfg.rollout.num_prompts, d.world)
    if not new or n == cfg.rollout.num_prompts:
        return cfg, []
    line = f"rollout.num_prompts {cfg.rollout.num_prompts} -> {n}: {n // d.world} for each of {d.world} processes"
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, num_prompts=n)), [line]


def _train_rank(prep: _Prepared, voice: Voice, flag: StopFlag) -> dict[str, Any]:
    """The loop under the stop signals; rank 0 speaks for the run (a signal to any rank stops them all after the
    iteration)."""
    req, cfg = prep.request, prep.request.config
    main = req.dist.main

    def started() -> None:
        for line in prep.header:
            voice.note(line)
        voice.note(f"loading {cfg.model} ...")
        voice.progress("iterations", 0, cfg.train.iterations)  # the bar's clock from the start, not iteration 1

    def on_row(row: MetricsRow) -> None:
        voice.progress("iterations", row["iteration"] + 1, cfg.train.iterations)
        voice.on_row(row)

    hooks = Hooks(should_stop=lambda: flag.stop)
    if main:
        hooks = Hooks(
            progress=voice.progress,
            on_row=on_row,
            note=voice.note,
            should_stop=lambda: flag.stop,
            on_eval=voice.on_eval,
            started=started,
        )
    with stop_signals(flag, voice.stopping if main else lambda: None):
        summary = train_loop(req, hooks)
        flag.done = True  # a signal from here on finds the run complete
    return summary


def run_header(cfg: Config, device: str, new: bool, given: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The run's first lines: what it trains, on what, where, and where each choice came from (`given`: the keys
    the command line set)."""
    from ..models.hub import KNOWN

    p, n = cfg.policy, cfg.train.iterations

    def source(key: str, release: str) -> str:
        if not new:
            return "the run's"
        if key in given:
            return "given"
        return release if cfg.model in KNOWN else "the model's default"

    weights = f" ({p.weights} weights, {p.size} size)" if p.weights == "random" else ""
    return [
        f"{'starting' if new else 'resuming'} {cfg.name}: model {cfg.model}{weights}; "
        f"reward {', '.join(cfg.reward.names)} ({source('reward.names', 'the paper reward of the preset')}); "
        f"prompts {cfg.rollout.prompts} (held out: {held_out(cfg)}; "
        f"{source('rollout.prompts', 'the shipped general prompts')}); {n} iteration{'s' * (n != 1)}",
        *device_notes(device, cfg.model, p.weights, p.size),
    ]


def held_out(cfg: Config) -> str:
    """Where a run's held-out prompts come from: their list, or the share of the training list split off."""
    split = cfg.rollout.eval_split
    if not split:
        return str(cfg.rollout.eval_prompts)
    return f"{split:g} {'of them' if split >= 1 else 'share of them'}, drawn with the seed"


def device_notes(device: str, model: str | None = None, weights: str = "pretrained", size: str = "full") -> list[str]:
    """Lines a run prints before it starts: where it computes, and a warning when a released model of billions
    of parameters is about to be built on the CPU."""
    notes = [f"device: {device}" + (" (no GPU seen by torch)" if device == "cpu" else "")]
    if device == "cpu" and model and size == "full":
        from ..models.releases import releases

        spec = releases().get(model)
        if spec is not None and spec.denoiser_b >= 1:
            notes.append(
                f"warning: {model} has {spec.denoiser_b:g} billion denoiser parameters and is about to be built on "
                "the CPU (hours an iteration, fp32 memory); pass --device cuda on a GPU machine"
                + (', or --set policy.size="tiny" to try the path' if weights == "random" else "")
            )
    return notes
