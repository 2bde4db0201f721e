from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    DEVICE_HELP,
    MODEL_PANEL,
    command_line,
    err,
    guarded,
    model_help,
    one_line,
    print_json,
    progress_bar,
)
from .train_options import DEFAULT_PRESET, policy_sets


def rollout(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the tree shards to.")],
    preset: Annotated[
        str, typer.Option(help="Method preset (see `treegrpo presets`); the same default as `train`'s.")
    ] = DEFAULT_PRESET,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML config file layered over the preset.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override one key, e.g. --set tree.branch=3 (repeatable).")
    ] = None,
    prompts: Annotated[
        str | None,
        typer.Option(
            help="Prompts: .txt one per line, .jsonl with a 'prompt' field, "
            "or a built-in list (shapes-train, shapes-test, ...); default: the model's."
        ),
    ] = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(
            "--num-prompts",
            "-n",
            min=1,
            help="How many prompts to roll out, drawn as `train` draws them "
            "(default: the config's rollout.num_prompts).",
        ),
    ] = None,
    iteration: Annotated[
        int,
        typer.Option(min=0, help="Write the trees `train` samples at this iteration: its prompts, schedule and noise."),
    ] = 0,
    seed: Annotated[int | None, typer.Option(help="Seed of every node's noise (default: the config's).")] = None,
    model: Annotated[str | None, typer.Option(help=model_help("the preset's"))] = None,
    max_batch: Annotated[int | None, typer.Option("--max-batch", min=1, help="Rows per model forward.")] = None,
    prompts_per_shard: Annotated[int, typer.Option("--prompts-per-shard", min=1, help="Prompts per tree shard.")] = 8,
    save_images: Annotated[bool, typer.Option("--save-images", help="Also write every leaf image as a PNG.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing tree folder.")] = False,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (the model).")] = "auto",
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    revision: Annotated[
        str | None,
        typer.Option(help="Hub revision (branch, tag or commit) of --model.", rich_help_panel=MODEL_PANEL),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="Weights: auto (bf16 on CUDA, fp32 elsewhere), bf16 or fp32.", rich_help_panel=MODEL_PANEL),
    ] = None,
) -> None:
    """Roll out trees with a method preset and write them as safetensors shards.

    The trees are those `treegrpo train` samples at --iteration (default 0), so rollout, score and
    train --trees make the same update as one online iteration.

    Examples:

      treegrpo rollout --preset branch --num-prompts 4 --out runs/trees

      treegrpo rollout --model flux-dev --preset branch-mix-flow --prompts prompts.txt --out runs/flux-trees
    """
    from ..config import config_layers, load_config, user_warnings
    from ..preflight import check_own_dir, check_writable_dir, resolve_device
    from ..training.stages import RolloutRequest, run_rollout

    with guarded():
        device = resolve_device(device)
        check_writable_dir(out, "--out")
        check_own_dir(out, "--out", _own_folder, "a treegrpo tree folder (it has no index.json)")
        sets = list(set_ or [])
        sets += [f"seed={seed}"] if seed is not None else []
        sets += [f"model={json.dumps(model)}"] if model else []
        sets += [f"rollout.max_batch={max_batch}"] if max_batch else []
        sets += policy_sets(revision=revision, dtype=dtype)
        cfg = load_config(preset, config, sets)
        for w in user_warnings(cfg, config_layers(preset, config, sets)):
            err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
        req = RolloutRequest(
            cfg,
            _training_prompts(prompts or cfg.rollout.prompts, cfg),
            out,
            num_prompts,
            prompts_per_shard,
            save_images,
            overwrite,
            device,
            command_line(),
            iteration,
        )
        with progress_bar() as bar:
            summary = run_rollout(req, bar)
    if (note := repeats_note(summary)) is not None:
        err.print(note, highlight=False, markup=False, soft_wrap=True)
    if json_:
        print_json(summary)
    else:
        err.print(
            f"wrote {summary['trees']} trees ({summary['leaves_per_tree']} leaves each, "
            f"{summary['nfe_per_tree']:.0f} model evaluations per tree) to {summary['out']}"
        )


def _training_prompts(path: str, cfg) -> list:
    """The prompts `train` trains on: the file's, less those rollout.eval_split holds out."""
    from ..prompts import load_prompts, split_prompts

    prompts = load_prompts(path)
    return split_prompts(prompts, cfg.rollout.eval_split, cfg.seed)[0] if cfg.rollout.eval_split else prompts


def _own_folder(path: Path) -> bool:
    """A tree folder, or what a rollout killed at its first write left (its temporary files)."""
    from ..store.shards import LEFTOVERS, TEMP

    return (path / "index.json").is_file() or all(p.name in LEFTOVERS or TEMP.match(p.name) for p in path.iterdir())


def repeats_note(summary: dict) -> str | None:
    """One line when some prompt is rolled out in more than one tree (None when each is rolled out once)."""
    if summary["most_trees_of_a_prompt"] <= 1:
        return None
    why = []
    if summary["num_prompts"] > summary["distinct_prompts"]:
        why.append(f"{summary['num_prompts']} prompts drawn from the {summary['prompts_given']} given cycle them")
    if summary["trees_per_prompt"] > 1:
        why.append(f"tree.trees_per_prompt = {summary['trees_per_prompt']}")
    return (
        f"note: {summary['trees']} trees of {summary['distinct_prompts']} distinct "
        f"prompt{'s' * (summary['distinct_prompts'] != 1)}: each is rolled out in up to "
        f"{summary['most_trees_of_a_prompt']} trees ({'; '.join(why)})"
    )
