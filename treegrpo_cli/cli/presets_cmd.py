from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from .common import guarded, out, print_json


def presets(json_: Annotated[bool, typer.Option("--json", help="List as JSON.")] = False) -> None:
    """List the method presets (one TOML file each)."""
    from ..config import load_config, preset_names, preset_path

    with guarded():
        rows: list[dict[str, Any]] = []
        for name in preset_names():
            cfg = load_config(name)
            rows.append(
                {
                    "name": name,
                    "description": cfg.description,
                    "path": str(preset_path(name)),
                    "trees_per_prompt": cfg.tree.trees_per_prompt,
                    "leaves_per_prompt": cfg.tree.leaves(cfg.sampler.steps) * cfg.tree.trees_per_prompt,
                    "evals_per_prompt": cfg.tree.model_evals(cfg.sampler.steps) * cfg.tree.trees_per_prompt,
                    "objective": cfg.train.objective,
                }
            )
    if json_:
        print_json(rows)
        return
    table = Table("preset", "leaves/prompt", "evals/prompt", "evals/sample", "description")
    for r in rows:
        per_sample = f"{r['evals_per_prompt'] / r['leaves_per_prompt']:.1f}"
        table.add_row(r["name"], str(r["leaves_per_prompt"]), str(r["evals_per_prompt"]), per_sample, r["description"])
    out.print(table)
