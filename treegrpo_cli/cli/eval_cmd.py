"""`treegrpo eval`: reward metrics of a model, a training checkpoint or a folder of images."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import ConfigError
from .common import DEVICE_HELP, err, guarded, model_help, print_json, progress_bar
from .common import out as stdout


def eval_(
    model: Annotated[
        str | None,
        typer.Option(help=model_help("the config's, as for `treegrpo train`") + " Or a weights file."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="A training checkpoint: a step-N folder, or a run folder (its newest checkpoint)."),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="With --checkpoint RUN: the run's best checkpoint by its guard (RUN/best).")
    ] = False,
    ema: Annotated[
        bool, typer.Option("--ema/--no-ema", help="Use the checkpoint's EMA weights when it has them.")
    ] = True,
    prompts: Annotated[
        str | None,
        typer.Option(
            help="Prompts: a .txt/.jsonl file or a built-in list (default: the checkpoint's run's held-out "
            "prompts, or the config's); with --images, the image->prompt map (.json/.csv)."
        ),
    ] = None,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", min=1, help="Use only the first N prompts.")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            "--reward",
            help="Reward names, comma separated: shapes, hps, pick, imagereward, clip, aesthetic, "
            "jpeg-compressibility, ... (default: the checkpoint's run's, or the config's).",
        ),
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Sample --model with this preset's sampler (see `treegrpo presets`).")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML config file layered over the preset.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override one config key, e.g. --set sampler.steps=20.")
    ] = None,
    num_images: Annotated[
        int | None,
        typer.Option(
            "--num-images", min=1, help="Images per prompt (default: a checkpoint's run's held-out samples, else 1)."
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the root noises: sample j of a prompt is the same for model and baseline, and a "
            "checkpoint's run seeded with it drew the same for its held-out reward."
        ),
    ] = 0,
    sde: Annotated[
        bool, typer.Option("--sde/--ode", help="Sample with the SDE at every step instead of the deterministic ODE.")
    ] = False,
    steps: Annotated[
        int | None, typer.Option(min=1, help="Denoising steps (default: the model's or checkpoint's config).")
    ] = None,
    images: Annotated[
        Path | None,
        typer.Option(help="Score the images of this folder instead of generating (see docs/rewards.md)."),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Also evaluate this model, checkpoint (or, with --images, image folder) and add a delta column."
        ),
    ] = None,
    reward_opt: Annotated[
        list[str] | None,
        typer.Option(
            "--reward-opt",
            help="A reward option NAME.KEY=VALUE, e.g. hps.checkpoint=/w/HPS_v2.1_compressed.pt (repeatable).",
        ),
    ] = None,
    reward_dtype: Annotated[
        str | None,
        typer.Option("--reward-dtype", help="dtype of the reward models: float32 (default), bfloat16, float16."),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Images generated and scored at a time.")] = 16,
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="Rows per model forward.")] = 64,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (the model and the reward models).")] = "auto",
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write results.json, results.csv and samples.png here.")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Evaluate a model or checkpoint with reward metrics (ODE samples by default), or score a folder of images.

    Examples:

      treegrpo eval --checkpoint runs/my-run --baseline tiny-shapes --num-images 4

      treegrpo eval --checkpoint runs/my-run --best      # the guard's best held-out evaluation (RUN/best)

      treegrpo eval --model flux-dev --preset branch-mix-flow --reward hps,pick --prompts prompts.txt

      treegrpo eval --images generated/ --metric clip --out runs/eval
    """
    from ..preflight import check_own_dir, check_writable_dir, resolve_device
    from ..report.evalio import OUTPUTS, is_eval_output, write_outputs
    from ..report.evaluate import EvalRequest, check_needs, run_eval
    from ..rewards.base import parse_reward_options

    with guarded():
        if best:
            from ..errors import ConfigError
            from ..training.rundir import best_checkpoint

            if checkpoint is None:
                raise ConfigError("--best picks a run's best checkpoint: give the run with --checkpoint RUN")
            checkpoint = best_checkpoint(checkpoint)
        device = resolve_device(device)
        if out is not None:
            check_writable_dir(out, "--out")  # before anything is generated
            check_own_dir(out, "--out", is_eval_output, f"an earlier eval's output (only {', '.join(OUTPUTS)})")
        req = EvalRequest(
            metrics=(),
            model=model,
            checkpoint=checkpoint,
            ema=ema,
            num_images=num_images or 1,
            seed=seed,
            sde=sde,
            steps=steps,
            images=images,
            baseline=baseline,
            batch=batch,
            max_batch=max_batch,
            device=device,
            reward_dtype=reward_dtype,
            reward_options=parse_reward_options(reward_opt or []),
            preset=preset,
            config=config,
            sets=tuple(set_ or []),
        )
        _what_to_score(req, metric, prompts, num_prompts, num_images)
        check_needs(req)  # every model, baseline and metric with its files: one line, before any image is made
        with progress_bar() as bar:
            summary, scored = run_eval(req, bar)
        if out is not None:
            summary["files"] = write_outputs(out, summary, scored)
    if json_:
        print_json(summary)
        return
    stdout.print(_table(summary))
    if out is not None:
        err.print(f"wrote {', '.join(summary['files'])}")


def _what_to_score(
    req, metric: str | None, prompts: str | None, num_prompts: int | None, num_images: int | None
) -> None:
    """Fill in req's metrics (default: the run's or the config's rewards) and, when it generates, its prompts and
    images per prompt, its size checked before any model is loaded."""
    from ..config import check_eval_size
    from ..prompts import held_out_prompts, load_prompts
    from ..report.evaluate import default_num_images, source_config

    cfg = source_config(req) if req.images is None else None  # the run's or the config's defaults
    names = metric if metric is not None else ",".join(cfg.reward.names if cfg else ("shapes",))
    req.metrics = tuple(m.strip() for m in names.split(",") if m.strip())
    if cfg is None:
        req.prompts_file = Path(prompts) if prompts else None
        if num_prompts is not None:
            raise ConfigError("--num-prompts selects generation prompts; it does not apply to --images")
        return
    req.num_images = num_images or default_num_images(req, cfg)
    r = cfg.rollout  # the run's held-out prompts: their own list, or those it split off its training prompts
    held = load_prompts(prompts) if prompts else held_out_prompts(r.prompts, r.eval_prompts, r.eval_split, cfg.seed)
    req.prompts = held[:num_prompts]
    check_eval_size(len(req.prompts), req.num_images, req.steps)  # bounded work, before any model is loaded


def _table(summary: dict[str, Any]) -> Table:
    from .common import one_line

    src = summary["source"]
    what = src.get("checkpoint") or src.get("images") or src.get("model")
    how = summary["sampling"] if summary["sampling"] == "folder" else f"{summary['sampling']} samples"
    table = Table(title=one_line(f"eval of {what} ({summary['images']} images, {how})"))
    base = "baseline" in summary
    cols = ["metric", "mean", "std", "n"] + (["baseline", "delta"] if base else [])
    for c in cols:
        table.add_column(c, justify="left" if c == "metric" else "right")
    for name, m in summary["metrics"].items():
        row = [name, f"{m['mean']:.4f}", f"{m['std']:.4f}", str(m["n"])]
        if base:
            row += [f"{m['baseline_mean']:.4f}", f"{m['delta']:+.4f}"]
        table.add_row(*row)
    if base:
        b = summary["baseline"]
        table.caption = f"baseline: {b.get('checkpoint') or b.get('images') or b.get('model')}"
    return table
