"""`treegrpo train --dry-run`: training/dryrun.py's report as lines (stdout) or JSON; exit 2 when the run lacks
something (named), else 0. Nothing is loaded, written or downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import ConfigError
from .common import one_line, out, print_json


def dry_run(
    preset: str,
    config: Path | None,
    sets: list[str],
    prompts: str | None,
    resume: Path | None,
    trees: Path | None,
    nproc: int,
    as_json: bool,
) -> None:
    """Print the dry run's report of `train`'s options (sets: its --set items and the options made into them) and
    exit: 2 when something is missing, else 0."""
    from ..training.dryrun import dry_run as plan
    from ..training.dryrun import lines

    if trees is not None:
        raise ConfigError("--dry-run plans an online run; --trees makes one update from stored trees: leave one out")
    sets = sets + ([f"rollout.prompts={json.dumps(prompts)}"] if prompts else [])
    report = plan(None if resume is not None else preset, config, sets, resume, nproc)
    if as_json:
        print_json(report)
    else:
        for line in lines(report):
            out.print(one_line(line), highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(2 if report["missing"] else 0)
