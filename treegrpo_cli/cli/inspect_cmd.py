from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import guarded, one_line, out, print_json


def inspect(
    trees: Annotated[Path, typer.Argument(help="A tree folder written by `treegrpo rollout`.")],
    json_: Annotated[bool, typer.Option("--json", help="Every node of every tree as JSON.")] = False,
) -> None:
    """Summarise a tree folder: shape, model evaluations, rewards, advantages, trained edges.

    Examples:

      treegrpo inspect runs/trees

      treegrpo inspect runs/trees --json
    """
    from ..report.tree_report import inspect_trees

    with guarded():
        report = inspect_trees(trees, with_nodes=json_)
    if json_:
        print_json({"trees": report["trees"], "meta": report["meta"], "groups": report["groups"]})
        return
    _render(report)


def _render(report: dict) -> None:
    meta = report["meta"]  # validated by inspect_trees: meta.config complete, the other fields typed when present
    cfg = meta["config"]
    n = meta["num_trees"]
    head = Table(title=one_line(str(meta.get("command") or "trees")), show_header=False, box=None)
    _row(head, "preset", str(cfg["name"]))
    _row(head, "model", str(meta.get("model", {}).get("name", cfg["model"])))
    _row(head, "trees", f"{n} ({meta.get('num_prompts', '?')} prompts x {meta.get('trees_per_prompt', '?')})")
    _row(head, "model evaluations", f"{meta.get('nfe', 0)} ({meta.get('nfe', 0) / max(n, 1):.1f} per tree)")
    _row(
        head,
        "sampler",
        f"{cfg['sampler']['steps']} steps, {cfg['sampler']['noise']} noise eta={cfg['sampler']['eta']}, "
        f"decode {cfg['sampler']['decode']}",
    )
    scoring = meta.get("scoring")
    if scoring:
        a = scoring.get("advantage", {})
        _row(
            head,
            "rewards",
            ", ".join(f"{k} x{v}" for k, v in scoring["rewards"].items()) + f" ({scoring.get('combine', '?')})",
        )
        _row(head, "advantages", f"{a.get('estimator', '?')} (ddof {a.get('ddof', '?')}, clamp {a.get('clamp', '?')})")
        g = report["groups"]
        if g is not None:
            _row(
                head,
                "groups",
                f"{g['zero_std_ratio']:.0%} with tied rewards, within-group std {g['reward_group_std']:.4f}",
            )
    else:
        _row(head, "rewards", "not scored yet: run `treegrpo score`")
    out.print(head)
    table = Table(title="per depth (denoising step)")
    for col in ("depth", "sigma", "nodes", "sde edges", "trained", "reward", "advantage"):
        table.add_column(col, justify="right")
    for d in report["depths"]:
        table.add_row(
            str(d["depth"]),
            f"{d['sigma']:.3f}",
            str(d["nodes"]),
            str(d["sde_edges"]),
            str(d["trained"]),
            _mean_std(d["reward_mean"], d["reward_std"]),
            _mean_std(d["advantage_mean"], d["advantage_std"]),
        )
    out.print(table)


def _mean_std(mean: float | None, std: float | None) -> str:
    return "" if mean is None else f"{mean:+.3f} ± {std:.3f}"


def _row(table: Table, key: str, value: str) -> None:
    """A row of text read from the folder's files: control and escape characters shown, not sent."""
    table.add_row(key, one_line(value))
