from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import ConfigError, TreegrpoError
from ..store import faults
from .common import (
    DEVICE_HELP,
    MODEL_PANEL,
    Signalled,
    command_line,
    device_notes,
    duration,
    err,
    fail,
    guarded,
    internal_error,
    model_help,
    number,
    on_stop_signals,
    one_line,
    out,
    parse_numbers,
    print_json,
    progress_bar,
    set_error_dir,
)

if TYPE_CHECKING:
    from ..training.runlog import EvalRow, MetricsRow

# The exit code of a run stopped early (it checkpointed first): 128 + the signal, as a shell reports it.
STOP_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


@contextmanager
def graceful_stop(flag: dict | None = None, quiet: bool = False) -> Iterator[dict]:
    """SIGTERM or a first Ctrl-C asks the loop to stop after the current iteration and checkpoint; the flag
    keeps the first signal (its exit code). quiet: say nothing (the other ranks of a data-parallel run)."""
    flag = flag if flag is not None else {}
    flag.setdefault("stop", False)
    flag.setdefault("signal", None)

    def ask(signum, frame):
        if flag["stop"] and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not flag["stop"]:
            flag["signal"] = signum
        flag["stop"] = True
        # a raw write: the signal may land inside a rich print or a lazy import of the main thread, and
        # printing through rich again from here re-enters them (a half-imported module, exit 1)
        if not quiet:
            os.write(2, b"stopping after this iteration (checkpoint follows); Ctrl-C again to abort\n")

    with on_stop_signals(ask):
        yield flag


def _sets(set_, model, reward, weights, iterations, seed, max_batch, reward_opt=None) -> list[str]:
    sets = list(set_ or [])
    sets += [f"model={json.dumps(model)}"] if model else []
    if reward is not None:  # --reward '' or ',' names no reward: the config refuses the empty list
        names = [n.strip() for n in reward.split(",") if n.strip()]
        sets.append("reward.names=[" + ", ".join(json.dumps(n) for n in names) + "]")
    sets += [f"reward.weights={json.dumps(parse_numbers(weights, '--weights'))}"] if weights else []
    sets += ["reward.options=[" + ", ".join(json.dumps(o) for o in reward_opt) + "]"] if reward_opt else []
    sets += [f"train.iterations={iterations}"] if iterations else []
    sets += [f"seed={seed}"] if seed is not None else []
    sets += [f"rollout.max_batch={max_batch}"] if max_batch else []
    return sets


def option_sets(model: str | None = None, reward: str | None = None, iterations: int | None = None) -> list[str]:
    """The --set items train makes of its --model, --reward and --iterations (`config show` takes them too)."""
    return _sets(None, model, reward, None, iterations, None, None)


def _log_sets(log: str | None) -> list[str]:
    if log is None:
        return []
    names = [] if log.strip() == "none" else [n.strip() for n in log.split(",") if n.strip()]
    if not names and log.strip() != "none":
        raise TreegrpoError("--log takes tensorboard, wandb, both (comma separated), or none")
    return ["train.log=[" + ", ".join(json.dumps(n) for n in names) + "]"]


def policy_sets(
    revision: str | None = None,
    finetune: str | None = None,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | None = None,
    dtype: str | None = None,
    gradient_checkpointing: bool | None = None,
) -> list[str]:
    """--set items of the [policy] section from the model options (shared with `rollout`)."""
    sets = [f"policy.revision={json.dumps(revision)}"] if revision else []
    sets += [f"policy.finetune={json.dumps(finetune)}"] if finetune else []
    sets += [f"policy.lora_rank={lora_rank}"] if lora_rank else []
    sets += [f"policy.lora_alpha={lora_alpha}"] if lora_alpha is not None else []
    if lora_targets:
        names = [n.strip() for n in lora_targets.split(",") if n.strip()]
        sets.append("policy.lora_targets=[" + ", ".join(json.dumps(n) for n in names) + "]")
    sets += [f"policy.dtype={json.dumps(dtype)}"] if dtype else []
    if gradient_checkpointing is not None:
        sets.append(f"policy.gradient_checkpointing={str(gradient_checkpointing).lower()}")
    return sets


DEFAULT_PRESET = "tree-grpo-mean"


def train(
    preset: Annotated[
        str | None, typer.Option(help=f"Method preset (see `treegrpo presets`); default {DEFAULT_PRESET}.")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML config file layered over the preset.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override one key, e.g. --set train.lr=1e-4 (repeatable).")
    ] = None,
    model: Annotated[str | None, typer.Option(help=model_help("the preset's"))] = None,
    reward: Annotated[
        str | None,
        typer.Option(
            help="Reward name(s), comma separated: built-in, an installed plugin's, FILE.py:FUNCTION, MODULE:FUNCTION "
            "or http://HOST:PORT (docs/rewards.md)."
        ),
    ] = None,
    weights: Annotated[str | None, typer.Option(help="Reward weights, comma separated.")] = None,
    reward_opt: Annotated[
        list[str] | None,
        typer.Option("--reward-opt", help="A reward option NAME.KEY=VALUE, e.g. shapes.kind=soft (repeatable)."),
    ] = None,
    prompts: Annotated[
        str | None,
        typer.Option(
            help="Training prompts: a .txt/.jsonl file or a built-in list (shapes-train, ...); default: the model's."
        ),
    ] = None,
    iterations: Annotated[int | None, typer.Option(min=1, help="Online iterations.")] = None,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", min=1, help="Prompts an iteration (rollout.num_prompts).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed.")] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", "--out", help="Run folder (default runs/<preset>-<time>).")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Continue the run in this folder from its last complete checkpoint.")
    ] = None,
    trees: Annotated[
        Path | None, typer.Option(help="One update from scored tree shards (rollout + score), then a checkpoint.")
    ] = None,
    max_batch: Annotated[int | None, typer.Option("--max-batch", min=1, help="Rows per model forward.")] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + ".")] = "auto",
    json_: Annotated[bool, typer.Option("--json", help="Print the final summary as JSON.")] = False,
    log: Annotated[
        str | None,
        typer.Option(
            "--log",
            help="Also log to tensorboard and/or wandb (comma separated; W&B offline unless set up); 'none' stops.",
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(help="Hub revision (branch, tag or commit) of --model.", rich_help_panel=MODEL_PANEL),
    ] = None,
    finetune: Annotated[
        str | None,
        typer.Option(help="'lora' (peft adapter, default) or 'full' fine-tuning.", rich_help_panel=MODEL_PANEL),
    ] = None,
    lora_rank: Annotated[
        int | None,
        typer.Option(
            "--lora-rank",
            min=1,
            help="LoRA rank (default: the adapter's, docs/models.md).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    lora_alpha: Annotated[
        float | None,
        typer.Option(
            "--lora-alpha",
            min=0,
            help="LoRA alpha (default: the adapter's, docs/models.md).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    lora_targets: Annotated[
        str | None,
        typer.Option(
            "--lora-targets", help="LoRA target module suffixes, comma separated.", rich_help_panel=MODEL_PANEL
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Weights: auto (bf16 on CUDA, fp32 elsewhere), bf16 (bfloat16) or fp32 (float32).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    gradient_checkpointing: Annotated[
        bool | None,
        typer.Option(
            "--gradient-checkpointing/--no-gradient-checkpointing",
            help="Recompute activations in the backward pass.",
            show_default=False,
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            min=1,
            help="Data-parallel processes on this machine (the prompts of an iteration are split between them); "
            "under torchrun, its own.",
        ),
    ] = 1,
) -> None:
    """Train online: roll out trees, score, compute advantages, prune, update; checkpoints and exact resume.

    Examples:

      treegrpo train                                   # the embedded world's main job

      treegrpo train --preset branch-mix-flow --model flux-dev --reward hps --prompts prompts.txt

      treegrpo train --resume runs/my-run --iterations 400
    """
    from ..preflight import resolve_device

    if nproc_per_node > 1 and "RANK" not in os.environ:
        _relaunch(nproc_per_node)
    stop: dict = {}
    with on_stop_signals(partial(_outside_loop, stop)):  # the loop installs its own; this covers the rest
        with guarded():
            _refuse_ignored(trees, resume, iterations, preset, config, prompts)
            device = resolve_device(device)
            sets = _sets(set_, model, reward, weights, iterations, seed, max_batch, reward_opt)
            sets += [f"rollout.num_prompts={num_prompts}"] if num_prompts else []
            sets += policy_sets(revision, finetune, lora_rank, lora_alpha, lora_targets, dtype, gradient_checkpointing)
            sets += _log_sets(log)
            if trees is not None:
                if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
                    raise TreegrpoError(
                        "train --trees makes one update in one process; run it without --nproc-per-node"
                    )
                summary = _staged(trees, run_dir, sets, device)
            else:
                summary = _online(preset or DEFAULT_PRESET, config, sets, prompts, run_dir, resume, device, stop)
            faults.point("train.summary")
            if summary:  # other ranks of a data-parallel run return none
                _report(summary, json_)
        _ending(summary, stop)


def _ending(summary: dict, stop: dict) -> None:
    """The last lines of a run a signal reached: stopped early (its resume command, the signal's exit code), or
    complete when the signal came too late to stop it."""
    late = stop.get("late") or stop.get("signal")
    if late and summary and not summary.get("stopped_early"):
        name = signal.Signals(late).name
        err.print(f"{name} came too late to stop the run before its last iteration: it is complete, every file written")
    if summary.get("stopped_early"):
        err.print(
            f"stopped early after {summary['iterations']} iterations (saved in the last checkpoint); "
            f"continue with: {summary['resume_command']}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(STOP_CODES.get(int(stop.get("signal") or signal.SIGTERM), 143))


def _outside_loop(stop: dict, signum: int, frame) -> None:
    """SIGTERM or SIGINT outside the training loop's own handling: before it, the command stops at once (nothing
    written yet); after it, while the summary is printed, the signal is noted and the finished run says so."""
    if not stop.get("done"):
        raise Signalled(signum)
    stop.setdefault("late", signum)


def _refuse_ignored(trees, resume, iterations, preset, config, prompts) -> None:
    """Options that the chosen mode would ignore are refused, not dropped."""
    if trees is not None:
        given = {"--resume": resume, "--iterations": iterations, "--preset": preset, "--config": config}
        given["--prompts"] = prompts
        for option, value in given.items():
            if value is not None:
                raise ConfigError(
                    f"--trees makes one update with the trees' own config and prompts; {option} cannot be used "
                    "with it (training keys go in --set)"
                )
    if resume is not None:
        for option, value in {"--preset": preset, "--config": config}.items():
            if value is not None:
                raise ConfigError(
                    f"--resume continues the run with its own settings; {option} cannot be used with it "
                    "(--set and --iterations change what a resumed run may change)"
                )


def _relaunch(nproc: int) -> None:
    """Run this same command in nproc processes (launch.py) and exit with their outcome."""
    from . import launch

    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            argv.append(a)
    code, line = launch.run(nproc, argv)
    if line:
        fail(line, code)
    raise typer.Exit(code)


def _online(preset, config, sets, prompts, run_dir, resume, device, stop: dict) -> dict:
    from ..config import config_layers, load_config, user_warnings
    from ..preflight import check_writable_dir
    from ..prompts import load_prompts
    from ..training import dist, rundir
    from ..training.loop import TrainRequest
    from ..training.loop import train as train_loop

    sets = sets + ([f"rollout.prompts={json.dumps(prompts)}"] if prompts else [])  # recorded in run.json
    d = dist.from_env()
    if resume is not None:
        cfg, run = rundir.resume_config(resume, sets), resume
        warnings = cfg.new_warnings(rundir.load_config(resume))  # what --set adds to those the run said
    else:
        cfg = load_config(preset, config, sets)
        warnings = user_warnings(cfg, config_layers(preset, config, sets))
        run = Path(dist.gather(str(run_dir or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"), d)[0])
    for w in warnings if d.main else []:
        err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    if resume is None and d.main:
        rundir.check_new(run)
        check_writable_dir(run, "--run-dir")
    set_error_dir(run)  # an internal error's traceback goes to the run folder (once it exists)
    dist.shard(cfg.rollout.num_prompts, d)  # divisible by the processes, before anything is written
    train_prompts, eval_prompts = load_prompts(cfg.rollout.prompts), load_prompts(cfg.rollout.eval_prompts)
    if resume is not None:
        rundir.check_prompts(run, "train", train_prompts)
        rundir.check_prompts(run, "eval", eval_prompts)
    if d.main:
        _check_weights(cfg)
    req = TrainRequest(cfg, train_prompts, eval_prompts, run, resume is not None, device, command_line(), d)
    given = {item.split("=", 1)[0].strip() for item in sets}
    header = [*run_header(cfg, device, resume is None, given), f"run folder: {run}"]  # said once the run is ours
    train_rank = partial(_train_rank, req, train_loop, d, cfg, run, stop, header)
    return _train_group(train_rank, d) if d.active else train_rank()


def _check_weights(cfg) -> None:
    """Every reward name, then the model's and the rewards' weights: one line before anything is printed."""
    from ..models.registry import check_available
    from ..rewards.base import check_rewards, check_weights, parse_reward_options

    reward_opts = parse_reward_options(cfg.reward.options)
    check_rewards(cfg.reward.names, reward_opts)  # every name, before loading
    check_available(cfg.model, cfg.policy)
    check_weights(cfg.reward.names, reward_opts)


def _train_group(train_rank: Callable[[], dict], d) -> dict:
    """One rank of a process group: its errors said as one line before the group goes, and a clean exit."""
    from ..training import dist

    done = False
    try:
        summary = train_rank()
        dist.barrier(d)  # every rank done before the group goes away
        done = True
        return summary
    except TreegrpoError as e:
        fail(str(e), e.exit_code)  # said before the group goes: tearing gloo down can abort
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as e:  # a peer failed (closed connection) or this rank did (a bug)
        from .launch import PEER_FAILURE

        first = (str(e).strip().splitlines() or [""])[0]
        fail(f"{type(e).__name__}: {first}" if PEER_FAILURE.search(first) else internal_error(e))
    finally:
        sys.stderr.flush()
        dist.shutdown()  # a live gloo group at interpreter exit aborts the process
        if done and not d.main:  # rank 0 reports; the others leave now: gloo's threads can still be
            sys.stdout.flush()  # winding down, and the interpreter's teardown then aborts the process
            os._exit(0)  # ("terminate called without an active exception")


def run_header(cfg, device: str, new: bool, given: set[str] | frozenset[str] = frozenset()) -> list[str]:
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
    lines = [
        f"{'starting' if new else 'resuming'} {cfg.name}: model {cfg.model}{weights}; "
        f"reward {', '.join(cfg.reward.names)} ({source('reward.names', 'the paper reward of the preset')}); "
        f"prompts {cfg.rollout.prompts} (held out: {cfg.rollout.eval_prompts}; "
        f"{source('rollout.prompts', 'the shipped general prompts')}); {n} iteration{'s' * (n != 1)}"
    ]
    return lines + device_notes(device, cfg.model, p.weights, p.size)


def iteration_line(row: MetricsRow) -> str:
    """An iteration's line: its reward, the share of prompt groups that tied (no advantage), what a dynamic rollout
    stopped and saved, and its seconds."""
    parts = [f"iteration {row['iteration']}: reward {row['reward_mean']:.4f} ± {row['reward_std']:.4f}"]
    if "zero_std_ratio" in row:
        parts.append(f"{row['zero_std_ratio']:.0%} of groups tied")
    if row.get("early_stops"):
        saved = row.get("evals_saved", 0) / max(row.get("evals_saved", 0) + row.get("rollout_evals", 0), 1)
        parts.append(f"{row['early_stops']} early stops" + (f" ({saved:.0%} of the forwards saved)" if saved else ""))
    if row.get("replaced"):
        parts.append(f"{row['replaced']} tied prompts replaced")
    return ", ".join([*parts, f"{row['seconds']['total']:.1f}s"])


def _train_rank(req, train_loop, d, cfg, run, stop: dict, header: list[str]) -> dict:
    from ..training.loop import Hooks

    if not d.main:  # rank 0 speaks for the run; a signal to any rank stops them all after the iteration
        with graceful_stop(stop, quiet=True) as flag:
            summary = train_loop(req, Hooks(should_stop=lambda: flag["stop"]))
            stop["done"] = True
            return summary
    with graceful_stop(stop) as flag, progress_bar(quiet=("rollout", "score", "update", "iterations", "eval")) as bar:

        def note(message: str) -> None:
            err.print(one_line(message), highlight=False, markup=False, soft_wrap=True)

        def on_row(row: MetricsRow) -> None:
            bar("iterations", row["iteration"] + 1, cfg.train.iterations)
            note(iteration_line(row))

        def on_eval(row: EvalRow) -> None:
            n = f"{row['prompts']} prompts x {row['samples']}"
            note(
                f"held-out reward at iteration {row['iteration']}: {row['reward_mean']:.4f} "
                f"± {row['reward_sem']:.4f} (sem; {n}, {row['weights']} weights)"
            )

        def started() -> None:
            for line in header:
                note(line)
            note(f"loading {cfg.model} ...")
            bar("iterations", 0, cfg.train.iterations)  # the bar's clock from the start, not from iteration 1

        hooks = Hooks(
            progress=bar, on_row=on_row, on_eval=on_eval, should_stop=lambda: flag["stop"], note=note, started=started
        )
        summary = train_loop(req, hooks)
        stop["done"] = True  # a signal from here on finds the run complete
        return summary


def _staged(trees: Path, run_dir, sets, device) -> dict:
    from ..preflight import check_writable_dir
    from ..training.stages import StagedRequest, staged_warnings, train_from_trees

    for w in staged_warnings(trees, sets):
        err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    run = run_dir or Path("runs") / f"staged-{time.strftime('%Y%m%d-%H%M%S')}"
    check_writable_dir(run, "--run-dir")
    set_error_dir(run)
    with progress_bar() as bar:
        return train_from_trees(StagedRequest(trees, run, sets, device, command_line()), bar)


# the summary's durations (rundir.summary's minutes; a staged update's metrics row: wall and seconds per phase)
DURATIONS = {"minutes": 60.0, "wall": 1.0}


def summary_value(key: str, v: object) -> str:
    """One value of the summary table: durations as a person reads them (57 s, 3.2 min), other floats to four
    significant digits (an lr of 3e-05 is not 0.0000); --json keeps the numbers."""
    if key in DURATIONS and isinstance(v, (int, float)) and not isinstance(v, bool):
        return duration(v * DURATIONS[key])
    if key == "seconds" and isinstance(v, dict):
        return ", ".join(f"{k} {duration(s) if isinstance(s, (int, float)) else s}" for k, s in v.items())
    return number(v) if isinstance(v, float) else str(v)


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    table = Table(title="training summary", show_header=False)
    for k, v in summary.items():
        table.add_row("training time" if k == "minutes" else k, summary_value(k, v))
    out.print(table)
    if "reward_first_tenth" in summary:
        out.print(
            f"mean reward, first tenth of the iterations: {number(summary['reward_first_tenth'])}; "
            f"last tenth: {number(summary['reward_last_tenth'])}"
        )
    for first, last in summary.get("stalled_iterations", []):
        err.print(
            f"warning: iterations {first}-{last} trained nothing (every group's leaves scored the same)",
            highlight=False,
        )
    if "heldout_after" in summary:
        out.print(
            f"held-out reward (ODE samples of the eval prompts): {number(summary['heldout_before'])} before, "
            f"{number(summary['heldout_after'])} after ({summary['heldout_gain']:+.4g})"
        )
