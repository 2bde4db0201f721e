from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import DEVICE_HELP, err, guarded, print_json


def export(
    run: Annotated[Path, typer.Argument(help="A run folder written by `treegrpo train`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the diffusers files to.")],
    step: Annotated[int | None, typer.Option(min=0, help="Checkpoint step (default: the latest).")] = None,
    ema: Annotated[
        bool, typer.Option("--ema/--no-ema", help="Export the EMA weights when the checkpoint has them.")
    ] = True,
    best: Annotated[
        bool, typer.Option("--best", help="The run's best checkpoint by its guard (RUN/best, guard.best).")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Write into a folder that is not empty.")] = False,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (the model is loaded there).")] = "auto",
    dtype: Annotated[
        str | None,
        typer.Option(
            help="The base model's weights while exporting: auto (bf16 on CUDA, fp32 elsewhere), bf16 or fp32 "
            "(default: the run's policy.dtype). The exported weights are those of the checkpoint either way."
        ),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Export a checkpoint in diffusers' format: LoRA weights for pipe.load_lora_weights, or a full model folder.

    Examples:

      treegrpo export runs/flux-branch --out exports/flux-branch-lora

      treegrpo export runs/flux-branch --step 200 --no-ema --out exports/step-200

      treegrpo export runs/flux-branch --best --out exports/best   # the guard's best held-out evaluation
    """
    from ..errors import ConfigError, shown
    from ..models.base import DTYPE_NAMES, DTYPES
    from ..preflight import check_writable_dir, resolve_device
    from ..training.export import ExportRequest, export_checkpoint

    with guarded():
        device = resolve_device(device)
        if dtype is not None:
            dtype = DTYPE_NAMES.get(dtype, dtype)  # torch's spellings too, as policy.dtype takes them
            if dtype not in DTYPES:
                raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}; got {shown(dtype)}")
        check_writable_dir(out, "--out")
        say = (lambda m: None) if json_ else (lambda m: err.print(m, highlight=False, markup=False, soft_wrap=True))
        summary = export_checkpoint(ExportRequest(run, out, step, ema, overwrite, device, dtype, best), say)
    if json_:
        print_json(summary)
    else:
        weights = "EMA weights" if summary["ema"] else "weights"
        err.print(
            f"exported the {weights} of step {summary['step']} ({summary['finetune']}) to {summary['out']}: "
            f"{', '.join(summary['files'])}",
            highlight=False,
            soft_wrap=True,
        )
