from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
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
    # the names are what the user types: never cut (the description wraps into what is left of the width; on a
    # terminal too narrow for a readable description column, each preset takes two lines instead)
    name_width = max((len(r["name"]) for r in rows), default=6)
    if out.width < name_width + 3 * 9 + 20:
        for r in rows:
            per_sample = r["evals_per_prompt"] / r["leaves_per_prompt"]
            out.print(
                f"{r['name']}: {r['leaves_per_prompt']} leaves/prompt, {r['evals_per_prompt']} evals/prompt, "
                f"{per_sample:.1f} evals/sample",
                highlight=False,
            )
            out.print(f"  {r['description']}", highlight=False)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("preset", no_wrap=True, min_width=name_width)
    for head in ("leaves/\nprompt", "evals/\nprompt", "evals/\nsample"):
        table.add_column(head, justify="right", no_wrap=True)
    table.add_column("description", ratio=1, overflow="fold")
    for r in rows:
        per_sample = f"{r['evals_per_prompt'] / r['leaves_per_prompt']:.1f}"
        table.add_row(r["name"], str(r["leaves_per_prompt"]), str(r["evals_per_prompt"]), per_sample, r["description"])
    out.print(table)
