from __future__ import annotations

import dataclasses
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

from ..errors import ConfigError, TreegrpoError
from ..store import faults
from .common import (
    DEVICE_HELP,
    MODEL_PANEL,
    Signalled,
    command_line,
    err,
    fail,
    guarded,
    internal_error,
    model_help,
    on_stop_signals,
    one_line,
    parse_numbers,
    progress_bar,
    set_error_dir,
)
from .dryrun_cmd import dry_run as dry_run_report
from .train_report import iteration_line, report_summary, run_header

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
            help="Training prompts: .txt, .jsonl, .json, .csv, .tsv, .parquet, a saved dataset folder, or a built-in "
            "list (shapes-train, ...); a record's other fields are its metadata. Default: the model's."
        ),
    ] = None,
    eval_prompts: Annotated[
        str | None,
        typer.Option(
            "--eval-prompts", help="Held-out prompts (the held-out reward, before_after.png, eval): a file or list."
        ),
    ] = None,
    eval_split: Annotated[
        float | None,
        typer.Option(
            "--eval-split",
            min=0,
            help="Hold out this many of --prompts (a count, or a share below 1), drawn with the seed, instead of "
            "--eval-prompts.",
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
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Load nothing: check the config, prompts, rewards and files; print an iteration's model evaluations, "
            "trained edges, TFLOPs and memory per process (--json: as JSON); exit 2 if anything is missing.",
        ),
    ] = False,
) -> None:
    """Train online: roll out trees, score, compute advantages, prune, update; checkpoints and exact resume.

    Examples:

      treegrpo train                                   # the embedded world's main job

      treegrpo train --preset branch-mix-flow --model flux-dev --reward hps --prompts prompts.txt

      treegrpo train --resume runs/my-run --iterations 400
    """
    from ..preflight import resolve_device

    if nproc_per_node > 1 and "RANK" not in os.environ and not dry_run:
        _relaunch(nproc_per_node)
    stop: dict = {}
    with on_stop_signals(partial(_outside_loop, stop)):  # the loop installs its own; this covers the rest
        with guarded():
            _refuse_ignored(trees, resume, iterations, preset, config, prompts)
            device = resolve_device(device)
            sets = _sets(set_, model, reward, weights, iterations, seed, max_batch, reward_opt)
            sets += [f"rollout.num_prompts={num_prompts}"] if num_prompts else []
            sets += [f"rollout.eval_prompts={json.dumps(eval_prompts)}"] if eval_prompts else []
            sets += [f"rollout.eval_split={eval_split}"] if eval_split is not None else []
            sets += policy_sets(revision, finetune, lora_rank, lora_alpha, lora_targets, dtype, gradient_checkpointing)
            sets += _log_sets(log)
            if dry_run:
                dry_run_report(preset or DEFAULT_PRESET, config, sets, prompts, resume, trees, nproc_per_node, json_)
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
                report_summary(summary, json_)
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
    from ..prompts import run_prompts
    from ..training import dist, resumecheck, rundir
    from ..training.loop import TrainRequest
    from ..training.loop import train as train_loop
    from ..training.needs import check_train

    sets = sets + ([f"rollout.prompts={json.dumps(prompts)}"] if prompts else [])  # recorded in run.json
    d = dist.from_env()
    if resume is not None:
        cfg, run = resumecheck.resume_config(resume, sets), resume
        warnings = cfg.new_warnings(rundir.load_config(resume))  # what --set adds to those the run said
    else:
        cfg = load_config(preset, config, sets)
        warnings = user_warnings(cfg, config_layers(preset, config, sets))
        run = Path(dist.gather(str(run_dir or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"), d)[0])
    if d.main:  # the model, its files and every reward's: one line naming all that is missing, before any print
        check_train(cfg)
    for w in warnings if d.main else []:
        err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    if resume is None and d.main:
        rundir.check_new(run)
        check_writable_dir(run, "--run-dir")
    set_error_dir(run)  # an internal error's traceback goes to the run folder (once it exists)
    scaled, n = [], dist.scaled_prompts(cfg.rollout.num_prompts, d.world)
    if resume is None and n != cfg.rollout.num_prompts:  # a new run's prompts an iteration: a multiple of the ranks
        scaled = [
            f"rollout.num_prompts {cfg.rollout.num_prompts} -> {n}: {n // d.world} for each of {d.world} processes"
        ]
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, num_prompts=n))
    dist.shard(cfg.rollout.num_prompts, d)  # divisible by the processes, before anything is written
    r = cfg.rollout
    train_prompts, eval_prompts = run_prompts(r.prompts, r.eval_prompts, r.eval_split, cfg.seed)
    if resume is not None:
        resumecheck.check_prompts(run, "train", train_prompts)
        resumecheck.check_prompts(run, "eval", eval_prompts)
    req = TrainRequest(cfg, train_prompts, eval_prompts, run, resume is not None, device, command_line(), d)
    given = {item.split("=", 1)[0].strip() for item in sets}
    header = [*run_header(cfg, device, resume is None, given), *scaled, f"run folder: {run}"]  # once the run is ours
    train_rank = partial(_train_rank, req, train_loop, d, cfg, run, stop, header)
    return _train_group(train_rank, d) if d.active else train_rank()


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
