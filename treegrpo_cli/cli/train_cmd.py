from __future__ import annotations

import json
import os
import signal
import time
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
    guarded,
    model_help,
    on_stop_signals,
    one_line,
    progress_bar,
    set_error_dir,
)
from .dryrun_cmd import dry_run as dry_run_report
from .launch import relaunch, say_fatal
from .train_options import DEFAULT_PRESET, log_sets, monitor_sets, policy_sets, train_sets
from .train_report import eval_line, iteration_line, report_summary

if TYPE_CHECKING:
    from ..training.run import RunRequest, StopFlag


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
    monitor: Annotated[
        str | None,
        typer.Option(
            help="Gold reward(s) the guard watches on the held-out images and never trains on, comma separated "
            "(guard.rewards; docs/rewards.md, Reward hacking)."
        ),
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
    from ..training.run import RunRequest, StopFlag

    if nproc_per_node > 1 and "RANK" not in os.environ and not dry_run:
        relaunch(nproc_per_node)
    flag, summary = StopFlag(), {}
    with on_stop_signals(partial(_outside_loop, flag)):  # the run's loop installs its own; this covers the rest
        with guarded():
            _refuse_ignored(trees, resume, iterations, preset, config, prompts)
            device = resolve_device(device)
            sets = train_sets(set_, model, reward, weights, iterations, seed, max_batch, reward_opt)
            sets += [f"rollout.num_prompts={num_prompts}"] if num_prompts else []
            sets += [f"rollout.eval_prompts={json.dumps(eval_prompts)}"] if eval_prompts else []
            sets += [f"rollout.eval_split={eval_split}"] if eval_split is not None else []
            sets += policy_sets(revision, finetune, lora_rank, lora_alpha, lora_targets, dtype, gradient_checkpointing)
            sets += log_sets(log) + monitor_sets(monitor)
            if dry_run:
                dry_run_report(preset or DEFAULT_PRESET, config, sets, prompts, resume, trees, nproc_per_node, json_)
            if trees is not None:
                summary = _staged(trees, run_dir, sets, device)
            else:
                summary = _online(
                    RunRequest(
                        preset or DEFAULT_PRESET,
                        config,
                        sets,
                        prompts,
                        run_dir,
                        resume,
                        device,
                        command_line(),
                        features=_feature_space,
                    ),
                    flag,
                )
            faults.point("train.summary")
            if summary:  # other ranks of a data-parallel run return none
                report_summary(summary, json_)
        _ending(summary, flag)


def _online(req: RunRequest, flag: StopFlag) -> dict:
    """The run (training/run.py) with its voice: rank 0's lines and progress bar, each rank's fatal error."""
    from ..training.run import RunAborted, Voice, start

    main = os.environ.get("RANK", "0") == "0"  # rank 0 speaks for the run
    with progress_bar(enabled=main, quiet=("rollout", "score", "update", "iterations", "eval")) as bar:
        voice = Voice(
            note=_say,
            progress=bar,
            on_row=lambda row: _say(iteration_line(row)),
            on_eval=lambda row: _say(eval_line(row)),
            on_run_folder=set_error_dir,  # an internal error's traceback goes to the run folder
            stopping=_stopping,
            fatal=say_fatal,
        )
        try:
            return start(req, voice, flag)
        except RunAborted as e:  # said already, the process group gone
            raise typer.Exit(e.exit_code) from None


def _feature_space(name: str, device: str):
    """guard.features' extractor (efficientnet, clip): the diversity command's (diversity/features.py)."""
    from ..diversity.features import check_available, get_extractor

    check_available(name)
    return get_extractor(name, device)


def _say(message: str) -> None:
    err.print(one_line(message), highlight=False, markup=False, soft_wrap=True)


def _stopping() -> None:
    # a raw write: the signal may land inside a rich print or a lazy import of the main thread, and printing
    # through rich again from here re-enters them (a half-imported module, exit 1)
    os.write(2, b"stopping after this iteration (checkpoint follows); Ctrl-C again to abort\n")


def _ending(summary: dict, flag: StopFlag) -> None:
    """The last lines of a run a signal reached: stopped early (its resume command, the signal's exit code), or
    complete when the signal came too late to stop it."""
    late = flag.late or flag.signal
    if late and summary and not summary.get("stopped_early"):
        name = signal.Signals(late).name
        err.print(f"{name} came too late to stop the run before its last iteration: it is complete, every file written")
    if summary.get("guard_stop"):
        from ..config.guard import GUARD_EXIT

        _say(f"stopped by the guard at iteration {summary['iterations']}: {summary['guard_stop']}; "
             f"best checkpoint: {summary.get('best_checkpoint', 'none')}; continue with: {summary['resume_command']} "
             "--set guard.action=warn")  # fmt: skip
        raise typer.Exit(GUARD_EXIT)
    if summary.get("stopped_early"):
        _say(f"stopped early after {summary['iterations']} iterations (saved in the last checkpoint); "
             f"continue with: {summary['resume_command']}")  # fmt: skip
        raise typer.Exit(flag.exit_code())


def _outside_loop(flag: StopFlag, signum: int, frame) -> None:
    """SIGTERM or SIGINT outside the run's loop: before it, the command stops at once (nothing written yet); after
    it, while the summary is printed, the signal is noted and the finished run says so."""
    if not flag.done:
        raise Signalled(signum)
    flag.late = flag.late or signum


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


def _staged(trees: Path, run_dir, sets, device) -> dict:
    from ..preflight import check_writable_dir

    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TreegrpoError("train --trees makes one update in one process; run it without --nproc-per-node")
    from ..training.stages import StagedRequest, staged_warnings, train_from_trees

    for w in staged_warnings(trees, sets):
        err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    run = run_dir or Path("runs") / f"staged-{time.strftime('%Y%m%d-%H%M%S')}"
    check_writable_dir(run, "--run-dir")
    set_error_dir(run)
    with progress_bar() as bar:
        return train_from_trees(StagedRequest(trees, run, sets, device, command_line()), bar)


# the summary's durations (rundir.summary's minutes; a staged update's metrics row: wall and seconds per phase)
