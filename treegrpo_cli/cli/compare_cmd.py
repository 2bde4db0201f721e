"""`treegrpo compare`: training runs side by side (reward against time, cost, memory), grouped over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import err, guarded, one_line, print_json
from .common import out as stdout


def compare(
    runs: Annotated[list[Path], typer.Argument(help="Run folders written by `treegrpo train`.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write compare.json, reward_vs_<x>.png, pareto.png, zero_std.png and index.html here "
            "(default: print the table only).",
        ),
    ] = None,
    x: Annotated[
        str,
        typer.Option(
            "--x",
            help="The axis of the curves and of time to target: time (wall-clock minutes of training), "
            "flops (cumulative denoiser TFLOPs, counted from the model's shapes) or iterations.",
        ),
    ] = "time",
    target: Annotated[
        float | None,
        typer.Option(
            help="Held-out reward to time the runs to (default: the baseline group's mean final held-out reward)."
        ),
    ] = None,
    baseline: Annotated[str | None, typer.Option(help="The group (label) the speed-ups are measured against.")] = None,
    gain: Annotated[
        bool,
        typer.Option(
            "--gain", help="Measure every run from its own first held-out evaluation (the target is then a gain)."
        ),
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="The trained weights' held-out reward where a run keeps an EMA "
            "(default: the EMA, the weights eval and export use).",
        ),
    ] = False,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="A run's group label, once per run in order "
            "(default: its preset name, split where the settings differ; runs of one label are seeds of one setting).",
        ),
    ] = None,
    allow_mixed_rewards: Annotated[
        bool,
        typer.Option(
            "--allow-mixed-rewards",
            help="Draw runs scored by different rewards on one axis (refused by default: their rewards are not "
            "on one scale).",
        ),
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print compare.json's content.")] = False,
) -> None:
    """Compare training runs: held-out reward against time, FLOPs or iterations, and the speed-up over a baseline.

    Per group of runs, mean over seeds: the held-out reward against wall-clock time (or FLOPs, or iterations), the
    time to a target reward and the speed-up over a baseline, seconds per iteration, model evaluations per sample
    and peak memory.

    Runs are grouped by what was run (run.json's settings): runs given one --label must share their model, rewards
    and settings (all but the seed); without --label, runs of one preset that differ are split into groups named
    by the differing settings. A seed repeated in a group is a warning.

    Examples:

      treegrpo compare runs/flow-s0 runs/flow-s1 runs/tree-s0 runs/tree-s1 --baseline flow-grpo --out runs/cmp

      treegrpo compare runs/bmf runs/dance --baseline dance-grpo --gain --x flops --target 0.25   # the table only
    """
    from ..preflight import check_own_dir, check_writable_dir
    from ..report.compare import compare_runs, to_dict
    from ..report.compare_page import COLUMNS, table_rows, write_report

    with guarded():
        if out is not None:
            check_writable_dir(out, "--out")
            check_own_dir(out, "--out", _is_compare_page, "an earlier compare page (compare.json, index.html, *.png)")
        cmp = compare_runs(runs, label, target, baseline, gain, x, raw, allow_mixed_rewards)
        if out is not None:
            write_report(cmp, out)
    for w in cmp.warnings:
        err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    if json_:
        print_json(to_dict(cmp))
        return

    rows = table_rows(cmp)
    table = Table(title=f"{_count(len(cmp.runs), 'run')} in {_count(len(cmp.groups), 'group')} (mean ± std over seeds)")
    table.add_column("")
    for row in rows:
        table.add_column(one_line(row[0]), justify="right")  # a label or a run's name: shown, not sent
    for i, name in enumerate(COLUMNS[1:], 1):  # one column per group: narrow terminals keep it readable
        table.add_row(name, *(row[i] for row in rows))
    if cmp.target is not None:
        table.caption = f"target held-out {cmp.measure} {cmp.target:.4f} on {cmp.unit}" + (
            f"; baseline {cmp.baseline}" if cmp.baseline else ""
        )
    stdout.print(table)
    if out is not None:
        err.print(f"wrote {', '.join(cmp.files)}", highlight=False)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("s" if n != 1 else "")


def _is_compare_page(folder: Path) -> bool:
    """A folder `compare` wrote: compare.json beside nothing but its page and plots."""
    names = {p.name for p in folder.iterdir()}
    return "compare.json" in names and all(n in ("compare.json", "index.html") or n.endswith(".png") for n in names)
