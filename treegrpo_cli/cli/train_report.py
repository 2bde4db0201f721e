"""What `treegrpo train` prints: the run's first lines, each iteration's line and the closing summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import duration, err, number, out, print_json

if TYPE_CHECKING:
    from ..training.runlog import EvalRow, MetricsRow


def eval_line(row: EvalRow) -> str:
    """A held-out evaluation's line."""
    n = f"{row['prompts']} prompts x {row['samples']}"
    line = (
        f"held-out reward at iteration {row['iteration']}: {row['reward_mean']:.4f} "
        f"± {row['reward_sem']:.4f} (sem; {n}, {row['weights']} weights)"
    )
    gold = {k[len("monitor/gold/") :]: v for k, v in row.items() if k.startswith("monitor/gold/") and "/std" not in k}
    if gold:
        line += "; gold " + ", ".join(f"{k} {v:.4f}" for k, v in gold.items())
    return line + ("; best so far (RUN/best)" if row.get("guard/best") and row["iteration"] else "")


def iteration_line(row: MetricsRow) -> str:
    """An iteration's line: its reward, the share of prompt groups that tied (no advantage), what a dynamic rollout
    stopped and saved, and its seconds."""
    parts = [f"iteration {row['iteration']}: reward {row['reward_mean']:.4f} ± {row['reward_std']:.4f}"]
    if "zero_std_ratio" in row:
        parts.append(f"{row['zero_std_ratio']:.0%} of groups tied")
    if row.get("early_stops"):
        saved = row.get("evals_saved", 0) / max(row.get("evals_saved", 0) + row.get("rollout_evals", 0), 1)
        parts.append(f"{row['early_stops']} early stops" + (f" ({saved:.0%} of the forwards saved)" if saved else ""))
    if row.get("replaced"):
        parts.append(f"{row['replaced']} tied prompts replaced")
    parts.append(f"{row['seconds']['total']:.1f}s")
    if row.get("guard"):  # the rules the last held-out evaluation fired
        parts.append(f"GUARD: {', '.join(row['guard'])}")  # type: ignore[typeddict-item]
    return ", ".join(parts)


DURATIONS = {"minutes": 60.0, "wall": 1.0}


def summary_value(key: str, v: object) -> str:
    """One value of the summary table: durations as a person reads them (57 s, 3.2 min), other floats to four
    significant digits (an lr of 3e-05 is not 0.0000); --json keeps the numbers."""
    if key in DURATIONS and isinstance(v, (int, float)) and not isinstance(v, bool):
        return duration(v * DURATIONS[key])
    if key == "seconds" and isinstance(v, dict):
        return ", ".join(f"{k} {duration(s) if isinstance(s, (int, float)) else s}" for k, s in v.items())
    return number(v) if isinstance(v, float) else str(v)


def report_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    table = Table(title="training summary", show_header=False)
    for k, v in summary.items():
        if k in ("guard", "guard_stop"):  # lines of their own below
            continue
        table.add_row("training time" if k == "minutes" else k, summary_value(k, v))
    out.print(table)
    if "reward_first_tenth" in summary:
        out.print(
            f"mean reward, first tenth of the iterations: {number(summary['reward_first_tenth'])}; "
            f"last tenth: {number(summary['reward_last_tenth'])}"
        )
    for first, last in summary.get("stalled_iterations", []):
        err.print(
            f"warning: iterations {first}-{last} trained nothing (every group's leaves scored the same)",
            highlight=False,
        )
    for line in summary.get("guard", []):
        err.print(f"guard: {line}", highlight=False, markup=False, soft_wrap=True)
    if "heldout_after" in summary:
        out.print(
            f"held-out reward (ODE samples of the eval prompts): {number(summary['heldout_before'])} before, "
            f"{number(summary['heldout_after'])} after ({summary['heldout_gain']:+.4g})"
        )
