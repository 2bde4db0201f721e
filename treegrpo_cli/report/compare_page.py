"""The comparison drawn and written: reward-against-axis and Pareto plots, the table, the self-contained page.

OUT/compare.json, OUT/reward_vs_X.png, OUT/pareto.png, OUT/zero_std.png, OUT/monitors.png (the guard's monitors,
where the runs kept them), OUT/index.html (see compare.py)
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from ..plots import band_chart, line_chart, point_chart, save_png, side_by_side
from ..rewards.monitors import STATS
from ..store.shards import atomic_write
from .compare import AXES, GRID_POINTS, PHASES, Comparison, GroupStats, Stat, interp, measured, to_dict

# --- plots -------------------------------------------------------------------------------------


def common_grid(curves: list[list[tuple[float, float]]], points: int = GRID_POINTS) -> list[float]:
    """Evenly spaced minutes over the span every curve covers (empty when they do not overlap)."""
    lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    if hi < lo:
        return []
    if hi == lo:
        return [lo]
    return [lo + (hi - lo) * i / (points - 1) for i in range(points)]


def mean_band(curves: list[list[tuple[float, float]]], grid: list[float]):
    """(grid, mean, min, max) of the curves interpolated onto the grid."""
    at = [[interp(x, c) for c in curves] for x in grid]
    return grid, [sum(v) / len(v) for v in at], [min(v) for v in at], [max(v) for v in at]


def reward_plot(cmp: Comparison):
    bands, marks, gain = {}, {}, cmp.measure == "gain"
    for g in cmp.groups:
        curves = [measured(r, gain) for r in cmp.runs if r.label == g.label and r.heldout_curve]
        bands[g.label] = mean_band(curves, common_grid(curves)) if curves else ([], [], [], [])
        marks[g.label] = [p for c in curves for p in c]
    label = f"target {cmp.target:{'+.3f' if gain else '.3f'}}" if cmp.target is not None else ""
    what = "held-out gain" if gain else "held-out reward"
    unit = AXES[cmp.axis][0]
    return band_chart(
        bands,
        f"{what} against {unit} (mean over seeds, min-max band, rings: measured)",
        unit,
        what,
        cmp.target,
        label,
        marks=marks,
    )


def zero_std_plot(cmp: Comparison):
    """zero_std_ratio over iterations, one line per run (None when no run logs it)."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in cmp.runs:
        if r.zero_std_curve:
            name = f"{r.label} · seed {r.seed}"
            name += f" · {Path(r.folder).name}" if name in series else ""  # a seed repeated in a group
            series[name] = ([x for x, _ in r.zero_std_curve], [y for _, y in r.zero_std_curve])
    if not series:
        return None
    return line_chart(
        series,
        "tied groups over training (zero_std_ratio: share of groups whose rewards all tie)",
        "iteration",
        "zero_std_ratio",
        integer_x=True,
        y_span=(0.0, 1.0),
    )


MONITOR_CHARTS = (  # title, y label, which drift/ curve of a run a line draws
    ("gold rewards: drift from the base (base spreads)", "base spreads", lambda k: k.startswith("gold/")),
    ("image statistics: the largest drift from the base", "base spreads", None),
    ("within-prompt diversity: share of the base's", "share", lambda k: k == "diversity/within"),
)


def monitor_plots(cmp: Comparison) -> list:
    """The guard's monitors, one line per run (and gold reward): what the runs' rewards do not show."""
    charts = []
    for title, ylabel, wanted in MONITOR_CHARTS:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for r in cmp.runs:
            name = f"{r.label} · seed {r.seed}"
            if wanted is None:  # |drift| of the statistic that moved most at each evaluation
                stats = [c for k, c in r.monitors.items() if k in STATS]
                if stats:
                    xs = [x for x, _ in stats[0]]
                    series[name] = (xs, [max(abs(c[i][1]) for c in stats) for i in range(len(xs))])
                continue
            for k, c in r.monitors.items():
                if wanted(k):
                    series[name + (f" · {k[5:]}" if k.startswith("gold/") else "")] = (
                        [x for x, _ in c],
                        [y for _, y in c],
                    )
        if series:
            charts.append(line_chart(series, title, "iteration", ylabel, size=(560, 360), integer_x=True))
    return charts


def pareto_plot(cmp: Comparison):
    nan = math.nan  # a group without the numbers keeps its colour, no point
    gain = cmp.measure == "gain"
    points = {
        g.label: (_or(g.seconds_per_iteration.mean, nan), _or((g.gain if gain else g.final_heldout).mean, nan))
        for g in cmp.groups
    }
    return point_chart(
        points,
        "cost against reward (mean over seeds)",
        "seconds per iteration",
        "final held-out gain" if gain else "final held-out reward",
    )


def _or(x: float | None, default: float) -> float:
    return default if x is None else x


# --- table and page ----------------------------------------------------------------------------

COLUMNS = [
    "group",
    "runs",
    "final held-out",
    "gain",
    "to target (seeds reaching it)",
    "speed-up (95% interval)",
    "s / iteration",
    "rollout s",
    "score s",
    "update s",
    "forward NFE / sample",
    "backward NFE / sample",
    "images / s",
    "tied groups",
    "peak MiB",
]


def _pm(s: Stat, fmt: str = ".4f") -> str:
    """mean, with +- std when there are several runs; '-' when no run has the value."""
    if s.mean is None:
        return "-"
    return f"{s.mean:{fmt}}" + (f" ± {s.std:{fmt.lstrip('+')}}" if s.n > 1 else "")


def _minutes(g: GroupStats) -> str:
    return "never" if g.curve_to_target is None else f"{g.curve_to_target:.2f}"


def speedup_text(speedup: float | None, low: float | None, high: float | None, none: str = "-") -> str:
    """'2.48x (1.60-3.70)': the speed-up and its interval, 'never' for a bound of 0 (draws that never reach
    the target; no interval when none does); `none` in place of a speed-up the mean curve does not have."""

    def bound(x: float | None) -> str:
        return "never" if x == 0 else f"{x:.2f}"

    spread = f" ({bound(low)}-{bound(high)})" if low is not None and high != 0 else ""  # (never-never): none
    return (none if speedup is None else f"{speedup:.2f}x") + spread


def speedup_cell(
    speedup: float | None,
    low: float | None,
    high: float | None,
    reached_at: float | None,
    never: str = "-",
    above: float | None = None,
) -> str:
    """speedup_text where a group's mean curve has no speed-up: `never` when it does not reach the target,
    '> 1.32x' when it does and the baseline does not within its runs (`above`, a lower bound; 'baseline never'
    without one), 'at start' when it is there before training."""
    if reached_at is None:
        none = never
    elif reached_at == 0:
        none = "at start"
    else:
        none = f"> {above:.2f}x" if above else "baseline never"
    return speedup_text(speedup, low, high, none=none)


def _speedup(g: GroupStats) -> str:
    return speedup_cell(g.speedup, g.speedup_low, g.speedup_high, g.curve_to_target, above=g.speedup_above)


def table_rows(cmp: Comparison) -> list[list[str]]:
    """One row of strings per group, in COLUMNS order."""
    rows = []
    for g in cmp.groups:
        reach = _minutes(g) + f" ({g.reached_target}/{len(g.runs)})" if cmp.target is not None else "-"
        rows.append(
            [
                g.label,
                f"{len(g.runs)} (seeds {', '.join(map(str, g.seeds))})",
                _pm(g.final_heldout),
                _pm(g.gain, "+.4f"),
                reach,
                _speedup(g),
                _pm(g.seconds_per_iteration, ".2f"),
                *(_pm(g.phase_seconds[p], ".2f") for p in PHASES),
                _pm(g.forward_nfe_per_sample, ".1f"),
                _pm(g.backward_nfe_per_sample, ".1f"),
                _pm(g.images_per_second, ".1f"),
                _pm(g.zero_std_ratio, ".2f"),
                _pm(g.peak_mib, ".0f"),
            ]
        )
    return rows


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _html_table(cmp: Comparison) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in table_rows(cmp))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _samples_html(cmp: Comparison) -> str:
    figures = []
    for r in cmp.runs:
        caption = html.escape(f"{r.label} · seed {r.seed} · {Path(r.folder).name}")
        if r.sample_grid is None:
            figures.append(f"<figure><p>no sample grid</p><figcaption>{caption}</figcaption></figure>")
            continue
        name = html.escape(Path(r.sample_grid).name)
        figures.append(
            f'<figure><img src="{_data_uri(Path(r.sample_grid).read_bytes())}" alt="{name}">'
            f"<figcaption>{caption} · {name}</figcaption></figure>"
        )
    return '<div class="samples">' + "".join(figures) + "</div>"


STYLE = """
body{font-family:sans-serif;margin:24px;color:#282828}
table{border-collapse:collapse;margin:12px 0}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
td{white-space:nowrap}
td:first-child,th:first-child{text-align:left}
th{background:#f2f2f2}
.plots{display:flex;flex-wrap:wrap;gap:16px}
.samples{display:flex;gap:16px;overflow-x:auto}
figure{margin:0}
figcaption{font-size:13px;margin-top:4px}
.warning{color:#a33}
"""


def page(cmp: Comparison, pngs: dict[str, bytes]) -> str:
    """index.html: everything inline (CSS, base64 PNGs), no scripts, nothing fetched."""
    target = "none" if cmp.target is None else f"{cmp.target:.4f}"
    images = "".join(f'<img src="{_data_uri(data)}" alt="{html.escape(name)}">' for name, data in pngs.items())
    warnings = "".join(f'<p class="warning">{html.escape(w)}</p>\n' for w in cmp.warnings)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>treegrpo compare</title>'
        f"<style>{STYLE}</style></head><body>\n"
        f"<h1>treegrpo compare: runs {len(cmp.runs)}, groups {len(cmp.groups)}</h1>\n"
        f"<p>axis: {html.escape(AXES[cmp.axis][1])}; "
        f"target held-out {cmp.measure}: {html.escape(target)}; baseline: {html.escape(cmp.baseline or 'none')}. "
        "Mean ± sample standard deviation over seeds; speed-up intervals: 95% of the speed-ups with both "
        "groups' seeds drawn again with replacement (never: draws that do not reach the target); &gt; 1.32x: a "
        "lower bound, where the baseline does not reach the target within its runs.</p>\n"
        f"{warnings}{_html_table(cmp)}\n<h2>Reward against time, cost against reward, tied groups</h2>\n"
        f'<div class="plots">{images}</div>\n'
        f"<h2>Latest samples</h2>\n{_samples_html(cmp)}\n</body></html>\n"
    )


def write_report(cmp: Comparison, out: Path) -> list[str]:
    """reward_vs_<axis>.png, pareto.png, compare.json and index.html under out; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pngs = {}
    plots = [(f"reward_vs_{cmp.axis}.png", reward_plot(cmp)), ("pareto.png", pareto_plot(cmp))]
    if (z := zero_std_plot(cmp)) is not None:
        plots.append(("zero_std.png", z))
    else:  # not one an earlier comparison of other runs left in this folder
        (out / "zero_std.png").unlink(missing_ok=True)
    monitors = monitor_plots(cmp)
    if monitors:
        plots.append(("monitors.png", side_by_side(monitors)))
    else:
        (out / "monitors.png").unlink(missing_ok=True)
    for name, image in plots:
        save_png(image, out / name)
        pngs[name] = (out / name).read_bytes()
    cmp.files = [str(out / n) for n in (*pngs, "compare.json", "index.html")]
    atomic_write(out / "compare.json", (json.dumps(to_dict(cmp), indent=1, allow_nan=False) + "\n").encode())
    atomic_write(out / "index.html", page(cmp, pngs).encode())
    return cmp.files
