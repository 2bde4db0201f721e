"""reward.png: a run's training and held-out reward, by iteration and by wall-clock time (from its logs)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from PIL import Image

from ..plots import band_chart, line_chart, save_png, side_by_side
from ..rewards.monitors import STATS
from .runlog import EvalRow, MetricsRow, is_number, read_evals, read_metrics


def reward_plot(run: Path) -> None:
    """reward.png: the training reward (the mean over an iteration's samples, their std as a band) and the
    held-out reward (eval.jsonl: the EMA and the trained weights where both are evaluated), against the
    iteration (left) and wall-clock minutes of training (right); a ring at every measured point."""
    rows = [r for r in read_metrics(run) if is_number(r.get("reward_mean")) and is_number(r.get("wall"))]
    if not rows:  # a staged update's row has neither
        return
    evals = read_evals(run)
    panels = [
        _reward_panel(rows, evals, False, "reward by iteration", "iteration (weights after N updates)"),
        _reward_panel(rows, evals, True, "reward by wall-clock time", "minutes of training"),
    ]
    image = side_by_side(panels)
    if any(k.startswith("drift/") for e in evals for k in e):  # the guard's monitors: a row of panels below
        image = _below(image, side_by_side(_monitor_panels(evals)))
    save_png(image, run / "reward.png")


MONITOR_PANELS = (
    ("trained and gold rewards: drift from the base", "base spreads", ("drift/reward", "drift/gold/"), 0.0),
    ("image statistics: drift from the base", "base spreads", tuple(f"drift/{k}" for k in STATS), 0.0),
    ("diversity: share of the base's", "share", ("drift/diversity/",), 1.0),
)  # title, y label, the fields drawn (a prefix: every field under it), the base's own value


def _monitor_panels(evals: list[EvalRow]):
    """The guard's monitors against the iteration: the trained reward beside the gold ones, the image statistics
    (both in the base's spreads) and diversity (a share of the base's); a ring at each evaluation."""
    panels = []
    keys = list(dict.fromkeys(k for e in evals for k in e if k.startswith("drift/")))
    base = [(float(evals[0]["iteration"]), True)] if evals and not any(k.startswith("drift/") for k in evals[0]) else []
    for title, ylabel, wanted, own in MONITOR_PANELS:
        series = {}
        for key in (k for k in keys if any(k == w or (w.endswith("/") and k.startswith(w)) for w in wanted)):
            pts = [(x, own) for x, _ in base]  # the base drifts nowhere from itself
            pts += [(float(e["iteration"]), float(v)) for e in evals if is_number(v := cast(dict, e).get(key))]
            series[key[len("drift/") :]] = ([x for x, _ in pts], [y for _, y in pts])
        if series:
            panels.append(line_chart(series, title, "iteration", ylabel, size=(480, 320), integer_x=True))
    return panels


def _below(top: Image.Image, bottom: Image.Image) -> Image.Image:
    out = Image.new("RGB", (max(top.width, bottom.width), top.height + bottom.height), "white")
    out.paste(top, (0, 0))
    out.paste(bottom, (0, top.height))
    return out


def reward_band(rows: list[MetricsRow]) -> tuple[list[float], list[float]]:
    """(low, high) of reward.png's training band: each iteration's mean ± std of its leaves' rewards, clipped to
    the lowest and highest reward it saw (reward_min, reward_max; rows written before those were kept: unclipped),
    so that a reward capped at 1 never draws its band above 1."""
    low, high = [], []
    for r in rows:
        m = float(r["reward_mean"])
        d = float(r["reward_std"]) if is_number(r.get("reward_std")) else float("nan")
        lo, hi = r.get("reward_min"), r.get("reward_max")
        low.append(max(m - d, float(lo)) if is_number(lo) else m - d)
        high.append(min(m + d, float(hi)) if is_number(hi) else m + d)
    return low, high


def _reward_panel(rows: list[MetricsRow], evals: list[EvalRow], minutes: bool, title: str, xlabel: str):
    walls = {r["iteration"]: r["wall"] for r in rows}

    def x(row: MetricsRow | EvalRow, held_out: bool) -> float:
        if not minutes:
            return float(row["iteration"])
        wall = row.get("wall")
        if held_out and not is_number(wall):  # an evaluation without its own: the iteration before it
            wall = walls.get(row["iteration"] - 1, 0.0)
        return float(wall or 0.0) / 60

    xs, mean = [x(r, False) for r in rows], [float(r["reward_mean"]) for r in rows]
    training = "training reward (mean ± std of its samples)"
    bands = {training: (xs, mean, *reward_band(rows))}
    marks = {training: list(zip(xs, mean, strict=True)) if len(rows) <= 60 else []}
    ema = any(is_number(e.get("raw/reward_mean")) for e in evals)

    def used(e: EvalRow) -> float | None:  # the weights `eval` uses: the EMA where there is one
        return e.get("reward_mean")

    def trained(e: EvalRow) -> float | None:
        return e.get("raw/reward_mean")

    curves = {"held-out, EMA": used, "held-out, trained": trained} if ema else {"held-out": used}
    for name, get in curves.items():
        points = sorted((x(e, True), float(y)) for e in evals if is_number(y := get(e)))
        ys = [y for _, y in points]
        bands[name] = ([p for p, _ in points], ys, ys, ys)
        marks[name] = points
    return band_chart(bands, title, xlabel, "reward", marks=marks, integer_x=not minutes)
