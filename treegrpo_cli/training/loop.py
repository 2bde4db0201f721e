"""The online training loop: iterations of the run's Trainer (trainer.py: rollout -> score -> advantages ->
pruning -> update), the run folder's metrics, held-out evaluations, sample grids and checkpoints, exact resume.

Everything random in an iteration is seeded by (seed, iteration): the prompts, the window, every
node's noise and the minibatch order. A checkpoint therefore only needs the weights, the EMA, the
optimizer and the iteration counter for a resumed run to repeat an uninterrupted one bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..config import Config
from ..engine.rollout import Progress
from ..errors import DiskFullError, TreegrpoError, disk_full, no_space
from ..store import faults
from ..store.checkpoint import list_checkpoints, load_checkpoint, retire, tidy
from . import dist, grids, resumecheck, rundir, runlock, runlog, runplots, tracking
from .dist import SINGLE, Dist
from .guard import Features, Watch, drift_fields, is_best, judge
from .heldout import heldout_row
from .runlog import EvalRow, MetricsRow
from .sampling import stream_seed
from .trainer import Trainer


@dataclass
class TrainRequest:
    config: Config
    prompts: list[str]  # training prompts
    eval_prompts: list[str]  # prompts of the sample grids
    run_dir: Path
    resume: bool = False
    device: str = "cpu"
    command: str = ""
    dist: Dist = SINGLE  # this process's rank in a data-parallel run (dist.py)
    features: Features | None = None  # the guard's diversity features (guard.features; None: pixels)


@dataclass
class Hooks:
    progress: Progress = lambda phase, done, total: None
    on_row: Callable[[MetricsRow], None] = lambda row: None
    note: Callable[[str], None] = lambda message: None  # resume, fallback and stall messages
    should_stop: Callable[[], bool] = lambda: False
    on_eval: Callable[[EvalRow], None] = lambda row: None  # a held-out evaluation's row, once written
    on_image: Callable[[str, Path, int], None] = lambda tag, path, step: None  # a sample grid, once written
    started: Callable[[], None] = lambda: None  # the run folder is this process's (locked, checked): loading begins


# --- the run ---------------------------------------------------------------------------------


def train(req: TrainRequest, hooks: Hooks = Hooks()) -> dict[str, Any]:
    """Train online until cfg.train.iterations (or train.max_minutes); resumable from the last good
    checkpoint. With several processes every rank trains and rank 0 alone writes the run folder; the
    sample grids, held-out evaluations and checkpoints are rank 0's work, or, for a sharded model, every
    rank's (each forward is a collective)."""
    tracking.check_available(req.config.train.log)  # a missing tracker package: before anything is written
    with ExitStack() as held:
        if req.resume and req.dist.main:  # one writer per run folder: refused before the model loads
            held.enter_context(runlock.lock(req.run_dir))
        if req.resume:
            resumecheck.check_resumable(req.run_dir, req.config)  # damaged files: refused before anything is written
        hooks.started()
        try:
            return _train(req, hooks, held)
        except DiskFullError as e:
            raise e.then(_resume_advice(req.run_dir)) from None
        except OSError as e:  # a full disk that a library reported as it is
            if not no_space(e):
                raise
            raise disk_full(e.filename or req.run_dir).then(_resume_advice(req.run_dir)) from None


def _resume_advice(run: Path) -> str:
    """What a run stopped by a full disk does next: resume from its last checkpoint, or from iteration 0 when it
    wrote none, or start again when not even its run folder was written."""
    if not (run / rundir.RUN_JSON).is_file():
        return "run the command again"
    done = list_checkpoints(run / rundir.CHECKPOINTS)
    cmd = rundir.resume_command(run)
    if not done:
        return f"continue with `{cmd}`: it starts again from iteration 0 (no checkpoint was written yet)"
    return f"continue with `{cmd}`: it goes on from its last checkpoint, {done[-1].name}, which is intact"


def _train(req: TrainRequest, hooks: Hooks, held: ExitStack) -> dict[str, Any]:
    cfg, d = req.config, req.dist
    t0 = time.perf_counter()
    trainer = Trainer(cfg, req.device, d)
    hooks.note(f"{trainer.policy.name} ready on {req.device} in {time.perf_counter() - t0:.1f}s")
    hooks = _open(trainer, req, hooks, held)
    done_rows = runlog.read_metrics(req.run_dir)
    start, wall = trainer.step, (done_rows[-1].get("wall", 0.0) if done_rows else 0.0)
    last = done_rows[-1] if done_rows else None  # the run's compute so far
    trainer.totals = {
        "flops_total": int(last.get("flops_total", 0)) if last else 0,
        "reward_images_total": int(last.get("reward_images_total", 0)) if last else 0,
    }
    wall0, budget = time.perf_counter() - wall, cfg.train.max_minutes * 60
    spent = lambda: bool(cfg.train.max_tflops and trainer.totals["flops_total"] >= cfg.train.max_tflops * 1e12)  # noqa: E731
    finished = trainer.step >= cfg.train.iterations or bool(budget and wall >= budget) or spent()
    stopped, stall, works, halted = False, 0, d.main or trainer.sharded, ""
    alarm = _alarm(req)  # the rules the last held-out evaluation fired: flagged on every iteration's row
    while not finished:
        row = trainer.iteration(req.prompts, hooks.progress)  # phases rollout, score, update
        row["wall"], last_wall = time.perf_counter() - wall0, wall
        last_tflops = trainer.totals["flops_total"] / 1e12
        runlog.add_fields(row, trainer.add_to_totals(row))
        wall = row["wall"]
        _check_finite(row, req.run_dir)
        votes = dist.gather((hooks.should_stop(), bool(budget and wall >= budget)), d)
        stopped = any(v[0] for v in votes)
        finished = trainer.step == cfg.train.iterations or votes[0][1] or spent()  # rank 0's clock decides the budget
        if alarm:
            row["guard"] = alarm  # type: ignore[typeddict-unknown-key]
        if d.main:  # the other ranks go on; the next iteration's gather waits for rank 0
            stall = _record(req, hooks, row, stall)
        fired: list[tuple[str, str]] = []  # the rules a held-out evaluation after this iteration fires
        if works:
            _outputs(trainer, req, stopped, finished, hooks)
            due = (
                _crossed(cfg.train.eval_every_minutes * 60, last_wall, wall)
                or _crossed(cfg.train.eval_every_tflops, last_tflops, trainer.totals["flops_total"] / 1e12)
                or bool(cfg.train.eval_every and trainer.step % cfg.train.eval_every == 0)
            )
            if not (finished or stopped) and due:
                t = time.perf_counter()
                fired = _heldout(trainer, req, hooks, wall)
                alarm = [rule for rule, _ in fired]
                wall0 += time.perf_counter() - t  # held-out evaluations do not count as training time
        halt = cfg.guard.action == "stop" and bool(dist.gather(bool(fired) if d.main else False, d)[0])
        if halt and not stopped and not finished:  # the guard stops the run here: its checkpoint first
            stopped, halted = True, _why(fired)
            if works and trainer.step % cfg.train.save_every:
                _save(trainer, req)
        if stopped:
            break

    summary = _close(trainer, req, hooks, start, wall, stopped, finished)
    return {**summary, "guard_stop": halted} if halted and summary else summary


def _open(trainer: Trainer, req: TrainRequest, hooks: Hooks, held: ExitStack) -> Hooks:
    """The run folder made (or resumed), the trackers attached, the first grid and held-out evaluation done;
    the hooks with the trackers behind them."""
    cfg, d = req.config, req.dist
    works = d.main or trainer.sharded  # this rank runs the grids', evaluations' and checkpoints' forwards
    if cfg.policy.free_text_encoders and hasattr(trainer.policy, "cache_prompts"):
        trainer.policy.cache_prompts(req.prompts + req.eval_prompts)  # embed once, then free the encoders
    if req.resume:
        _resume(trainer, req, hooks)
    elif d.main:
        held.enter_context(runlock.lock(req.run_dir, create=True))
        model: dict[str, Any] = getattr(trainer.policy, "describe", dict)()
        prompts = {"train": req.prompts, "eval": req.eval_prompts}
        rundir.create(req.run_dir, cfg, req.command, prompts, {"device": req.device, "model": model})
    if cfg.train.log and d.main:
        track = tracking.Tracking(req.run_dir, cfg.train.log, cfg.to_dict(), trainer.step if req.resume else None)
        hooks = tracking.tracked(hooks, held.enter_context(closing(track)))
    if not req.resume and cfg.train.sample_every and works:
        _grid(trainer, req, 0, hooks)
    if cfg.train.eval_samples and _main_says(lambda: not runlog.read_evals(req.run_dir), trainer, d):
        _heldout(trainer, req, hooks, 0.0)
    dist.barrier(d)
    return hooks


def _close(
    trainer: Trainer, req: TrainRequest, hooks: Hooks, start: int, wall: float, stopped: bool, finished: bool
) -> dict[str, Any]:
    """What a finished run still owes (its missing grids, a last held-out evaluation, before_after.png), then the
    run's summary (rank 0)."""
    cfg, d = req.config, req.dist
    works = d.main or trainer.sharded

    def last_eval() -> int:
        return runlog.read_evals(req.run_dir)[-1]["iteration"]

    if finished and works and cfg.train.sample_every and trainer.step:
        _missing_pictures(trainer, req, hooks)  # a resume repeats what a stopped run did not finish
    if cfg.train.eval_samples and finished and _main_says(lambda: last_eval() < trainer.step, trainer, d):
        _heldout(trainer, req, hooks, wall)  # also after a run killed between its last checkpoint and this
    faults.point("train.close")
    if finished and d.main and cfg.train.sample_every:  # titled with the last held-out reward
        path = grids.before_after(req.run_dir, trainer.step)
        if path is not None:
            hooks.on_image("before_after", path, trainer.step)
    dist.barrier(d)
    # a stop asked for during the last iteration came too late to stop anything: the run is complete
    return rundir.summary(req.run_dir, start, stopped and not finished) if d.main else {}


def _main_says(question: Callable[[], bool], trainer: Trainer, d: Dist) -> bool:
    """Rank 0's answer to a question about the run folder; the other ranks of a sharded run learn it (they
    take part in what follows), those of a replicated one answer no."""
    if not trainer.sharded:
        return d.main and question()
    return bool(dist.gather(question() if d.main else None, d)[0])


def _crossed(every: float, before: float, now: float) -> bool:
    """Did a counter (training seconds, TFLOPs) cross a multiple of `every` between `before` and `now`?"""
    return every > 0 and int(now // every) > int(before // every)


def _record(req: TrainRequest, hooks: Hooks, row: MetricsRow, stall: int) -> int:
    """Rank 0's bookkeeping of an iteration: metrics, hooks, stall warning."""
    runlog.append_metrics(req.run_dir, row)
    hooks.on_row(row)
    stall = stall + 1 if runlog.stalled(row) else 0
    if stall == runlog.STALL_ITERATIONS:
        hooks.note(runlog.stall_message(row["iteration"] - stall + 1, row["iteration"]))
    return stall


def _outputs(trainer: Trainer, req: TrainRequest, stopped: bool, last: bool, hooks: Hooks) -> None:
    """The checkpoint and sample grid due after an iteration."""
    cfg = trainer.cfg
    if last or stopped or trainer.step % cfg.train.save_every == 0:
        _save(trainer, req)
    if cfg.train.sample_every and (last or trainer.step % cfg.train.sample_every == 0):
        _grid(trainer, req, trainer.step, hooks)


def _missing_pictures(trainer: Trainer, req: TrainRequest, hooks: Hooks) -> None:
    """The last sample grid, reward.png and before_after.png of a finished run, when its last try stopped
    before writing them (a full disk, a kill)."""
    grid = req.run_dir / "samples" / f"step-{trainer.step}.png"
    if _main_says(lambda: not grid.is_file(), trainer, req.dist):
        _grid(trainer, req, trainer.step, hooks)
    if req.dist.main and (path := grids.missing_pictures(req.run_dir, trainer.step)) is not None:
        hooks.on_image("before_after", path, trainer.step)


def _grid(trainer: Trainer, req: TrainRequest, step: int, hooks: Hooks) -> None:
    path = grids.sample_grid(
        req.run_dir,
        trainer.policy,
        trainer.sde,
        req.eval_prompts,
        trainer.rewards,
        cfg=trainer.cfg,
        step=step,
        write=req.dist.main,
    )
    if req.dist.main:
        hooks.on_image("samples", path, step)


def _resume(trainer: Trainer, req: TrainRequest, hooks: Hooks) -> None:
    """Restore the newest checkpoint that verifies (a damaged one is named and skipped with a warning), say
    which, and drop the metrics and evaluations of the iterations after it (they are recomputed)."""
    run = req.run_dir
    rows = runlog.read_metrics(run)
    runlog.read_evals(run)  # damaged lines: refuse before anything
    said = req.dist.main  # rank 0 speaks for the run
    if said and (change := resumecheck.code_change(run)):
        hooks.note(change)
    if req.dist.main:  # under the run's lock: a killed save's or retirement's leftovers go, keep-last holds
        tidy(run / rundir.CHECKPOINTS, trainer.cfg.train.keep_last)
        tidy(run / rundir.BEST, 1)
    dist.barrier(req.dist)
    good, other = rundir.scan_checkpoints(run)
    for name, why in other:
        hooks.note(f"warning: {run / rundir.CHECKPOINTS / name}: {why}; skipped")
    damaged = bool(other)
    for path in reversed(good):
        try:
            ck = load_checkpoint(path)
        except (TreegrpoError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            hooks.note(f"warning: checkpoint {path.name} is damaged ({e}); falling back to the one before it")
            damaged = True
            continue
        trainer.restore(ck)
        hooks.note(
            f"resuming {run} from checkpoint {path.name} (iteration {trainer.step} of {trainer.cfg.train.iterations})"
        )
        break
    else:
        if damaged and rows:
            hooks.note(
                f"warning: {run} has no usable checkpoint left: starting again from iteration 0; the "
                f"{len(rows)} rows of {runlog.METRICS} are recomputed (same seeds: the same rows)"
            )
        else:
            hooks.note(f"{run} has no usable checkpoint yet: starting again from iteration 0")
    dist.barrier(req.dist)  # every rank has read the checkpoint before rank 0 trims the logs
    if req.dist.main:
        runlog.truncate_metrics(run, trainer.step)
        runlog.truncate_evals(run, trainer.step)
        for path in list_checkpoints(run / rundir.BEST):  # the best of evaluations after it: found again
            if int(path.name[len("step-") :]) > trainer.step:
                retire(path)


def _check_finite(row: MetricsRow, run: Path) -> None:
    """A non-finite loss or gradient stops the run before anything of this iteration is saved."""
    values = {"loss": row.get("loss"), "grad_norm": row.get("grad_norm"), "reward_mean": row.get("reward_mean")}
    bad = [(k, v) for k, v in values.items() if v is not None and not math.isfinite(v)]
    if bad:
        done = list_checkpoints(run / "checkpoints")
        keep = f"the last good checkpoint is {done[-1].name}" if done else "no checkpoint was written"
        raise TreegrpoError(
            f"iteration {row['iteration']}: {bad[0][0]} is {bad[0][1]}; training stopped without "
            f"saving this iteration ({keep}); lower train.lr or check the reward"
        )


def _heldout(trainer: Trainer, req: TrainRequest, hooks: Hooks, wall: float) -> list[tuple[str, str]]:
    """The held-out evaluation of the weights `eval` and `export` use (heldout.py) -> eval.jsonl, with the
    seconds of training so far, the guard's monitors and the rules they fire (returned; rank 0's), and RUN/best
    when it is the best evaluation by guard.best."""
    cfg, guard = trainer.cfg, trainer.cfg.guard
    if req.dist.main:
        n = f"{len(req.eval_prompts)} prompts x {cfg.train.eval_samples}"
        hooks.note(f"held-out evaluation at iteration {trainer.step}: {n}, ODE samples ...")
    row = heldout_row(
        trainer.policy,
        trainer.sde,
        req.eval_prompts,
        trainer.rewards,
        trainer.weights,
        ema=trainer.ema,
        samples=cfg.train.eval_samples,
        seed=stream_seed(cfg.seed, "heldout"),
        max_batch=cfg.rollout.max_batch,
        progress=lambda ph, d, t: hooks.progress("eval", d, t),
        watch=(lambda: Watch(guard, trainer.gold, req.features)) if guard.enabled else None,
    )
    fired: list[tuple[str, str]] = []
    best = False
    if req.dist.main:
        stamped = cast(EvalRow, {"iteration": trainer.step, "wall": wall, **trainer.totals, **row})
        earlier = runlog.read_evals(req.run_dir)
        if guard.enabled and earlier:  # the first evaluation is the base the others drift from
            runlog.add_fields(cast(Any, stamped), drift_fields(stamped, earlier[0]))
            fired = judge(guard, stamped)
        if fired:
            runlog.add_fields(cast(Any, stamped), {"guard/fired": [r for r, _ in fired], "guard/why": _why(fired)})
        best = guard.enabled and is_best(stamped, cast(Any, earlier), guard.best_monitor())
        if best:
            runlog.add_fields(cast(Any, stamped), {"guard/best": True})
        runlog.append_eval(req.run_dir, stamped)
        runplots.reward_plot(req.run_dir)  # with its held-out curve
        hooks.on_eval(stamped)
        if fired:
            hooks.note(f"guard ({guard.action}) at iteration {trainer.step}: {_why(fired)}")
    if _main_says(lambda: best, trainer, req.dist):
        trainer.save(req.run_dir, req.dist.main, folder=rundir.BEST)
    return fired


def _why(fired: list[tuple[str, str]]) -> str:
    return "; ".join(why for _, why in fired)


def _alarm(req: TrainRequest) -> list[str]:
    """The rules the run's last held-out evaluation fired (a resume goes on flagging them)."""
    evals = runlog.read_evals(req.run_dir) if req.resume and req.dist.main else []
    return list(cast(dict[str, Any], evals[-1]).get("guard/fired", [])) if evals else []


def _save(trainer: Trainer, req: TrainRequest) -> None:
    """Rank 0 writes the checkpoint (Trainer.save), then reward.png."""
    trainer.save(req.run_dir, req.dist.main)
    if req.dist.main:
        runplots.reward_plot(req.run_dir)
