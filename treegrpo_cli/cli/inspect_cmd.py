from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import duration, guarded, number, one_line, out, print_json


def inspect(
    trees: Annotated[
        Path, typer.Argument(help="A tree folder written by `treegrpo rollout` (or a run folder of `treegrpo train`).")
    ],
    json_: Annotated[bool, typer.Option("--json", help="Every node of every tree as JSON.")] = False,
) -> None:
    """Summarise a tree folder: shape, model evaluations, rewards, advantages, trained edges.

    Given a training run folder (run.json), a short summary of the run: its config, iterations, last checkpoint
    and held-out reward.

    Examples:

      treegrpo inspect runs/trees

      treegrpo inspect runs/trees --json
    """
    from ..report.run_report import inspect_run, is_run_folder
    from ..report.tree_report import inspect_trees
    from ..store.shards import INDEX

    with guarded():
        if is_run_folder(trees) and not (trees / INDEX).exists():
            run = inspect_run(trees)
            if json_:
                print_json(run)
            else:
                _render_run(run)
            return
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


def _render_run(run: dict) -> None:
    """A training run folder's summary, and the commands that read more of it; paths whole, never cut."""
    folder = run["run_dir"]
    rows = {"config": f"{run['config']}, model {run['model']}, reward {', '.join(run['rewards'])}"}
    done = f"{run['iterations']} of {run['planned_iterations']}"
    rows["iterations"] = done + (f" ({duration(run['minutes'] * 60)} of training)" if run["minutes"] else "")
    rows["last checkpoint"] = run["last_checkpoint"] or "none complete yet"
    if "heldout_after" in run:
        rows["held-out reward"] = (
            f"{number(run['heldout_before'])} at iteration {run['heldout_before_iteration']}, "
            f"{number(run['heldout_after'])} at iteration {run['heldout_after_iteration']} "
            f"({run['heldout_gain']:+.4g})"
        )
    elif "heldout_before" in run:
        rows["held-out reward"] = f"{number(run['heldout_before'])} at iteration {run['heldout_before_iteration']}"
    else:
        rows["held-out reward"] = "not evaluated"
    if run.get("guard"):
        rows["guard"] = "; ".join(run["guard"])
    if run.get("best_checkpoint"):
        rows["best checkpoint"] = run["best_checkpoint"]
    quoted = shlex.quote(folder)
    rows["more"] = (
        f"treegrpo compare {quoted} (its curves), treegrpo eval --checkpoint {quoted} (its samples' rewards), "
        f"treegrpo export {quoted} --out DIR (its weights)"
    )
    lines = [f"training run {folder} (a run folder of `treegrpo train`, not a tree folder)"]
    lines += [f"  {key + ':':<17}{value}" for key, value in rows.items()]
    for line in lines:
        out.print(one_line(line), highlight=False, soft_wrap=True)


def _mean_std(mean: float | None, std: float | None) -> str:
    return "" if mean is None else f"{mean:+.3f} ± {std:.3f}"


def _row(table: Table, key: str, value: str) -> None:
    """A row of text read from the folder's files: control and escape characters shown, not sent."""
    table.add_row(key, one_line(value))
