"""The run folder's logs: metrics.jsonl (a row per iteration) and eval.jsonl (the held-out reward), each row
checked on read, appended with fsync, cut back on resume; and what the rows say (stalls, tenths, gains)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Required, TypedDict, TypeGuard, cast, get_type_hints

from ..errors import TreegrpoError
from ..store.safeio import contained, loads_json
from ..store.shards import atomic_write

METRICS = "metrics.jsonl"
EVALS = "eval.jsonl"


# fields of a metrics row that measure the machine, not the run: they differ between two runs of one seed
TIMING_FIELDS = ("seconds", "wall", "peak_mib", "ms_per_image/", "images_per_second", "mfu/")


def is_timing(key: str) -> bool:
    return key.startswith(TIMING_FIELDS)


def without_timings(rows: list[MetricsRow] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their timing fields left out: what must equal between two runs of one seed and config."""
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


def is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def dangling_note(p: Path) -> str:
    return " (a broken symlink or a symlink loop)" if not p.exists() else ""


def read_metrics(run: Path) -> list[MetricsRow]:
    """The rows of metrics.jsonl. A torn last line (no newline: the process was killed while writing it)
    is left out; a damaged line before it is an error, not a silent truncation."""
    return cast(list[MetricsRow], _read_jsonl(run / METRICS, _check_metrics_row))


class Seconds(TypedDict, total=False):
    """A metrics row's "seconds": wall-clock seconds of each phase of the iteration."""

    rollout: float
    score: float
    update: float
    total: float
    score_hidden: float  # scoring that overlapped the rollout


class MetricsRow(TypedDict, total=False):
    """One line of metrics.jsonl, as written (key order included) and read back: an online iteration's
    (steps.metrics_row, then loop.py's seconds, memory, throughput, wall clock and compute), or a staged
    update's (stages.py: iteration, source, leaves, train_evals_per_leaf and the update's fields). Besides
    these, numbers under the prefixes of NUMBER_PREFIXES: per reward NAME "rewards/NAME/mean" and
    "rewards/NAME/std", per phase "ms_per_image/PHASE" and "mfu/PHASE" (add_fields writes them)."""

    iteration: Required[int]  # the weights after `iteration` updates sampled this row's trees
    source: str  # a staged update: the scored tree folder it trained on
    # the leaves' rewards (weighted sum over the run's rewards) and their spread within prompt groups
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    zero_std_ratio: float
    tied_leaf_share: float
    reward_group_std: float
    # the credited edges, the tree
    adv_mean: float
    adv_std: float
    adv_abs_max: float
    trained_edges: int
    leaves: int
    rollout_evals: int
    rollout_evals_per_leaf: float
    train_evals_per_leaf: float
    lr: float
    sde_steps: list[int] | str  # the stochastic steps, or "all"
    # the update's (engine/grpo.py: edges ... approx_kl; engine/nft.py, engine/awm.py: loss, grad_norm, kl_ref; all the
    # rest)
    edges: int
    loss: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    ratio_first_dev: float
    ratio_std: float
    clip_frac: float
    clip_frac_high: float
    clip_frac_low: float
    approx_kl: float
    kl_mask_frac: float  # train.trust = "kl-mask": the share of the edges its KL mask dropped (engine/kl_mask.py)
    kl_ref: float
    grad_norm: float
    optimizer_steps: float
    train_evals: float
    pad_chunks: int
    ema_updates: int
    old_decay: float
    kl_anchor: float  # AWM: mean |v - v_anchor|^2 over the trained rows
    anchor_decay: float  # AWM: the anchor's decay after the iteration
    # adaptive trees (docs/methods.md 16): the dynamic rollout's stops, fallbacks and x0-predictions scored, the
    # forwards and FLOPs its stops saved against the same trees undisturbed, prompts the budget replaced
    early_stops: int
    fallbacks: int
    judged_images: int
    evals_saved: int
    flops_saved: int
    replaced: int
    # the machine's (TIMING_FIELDS) and the run's compute so far
    seconds: Seconds
    peak_mib: float
    images_per_second: float
    wall: float  # seconds of training since the run started (held-out evaluations not counted)
    flops: int
    reward_images: int
    flops_total: int
    reward_images_total: int


# One line of eval.jsonl: a held-out evaluation (heldout.heldout_row) stamped by the loop. reward_mean and
# rewards/NAME/mean score the weights `eval` and `export` use (the EMA where `weights` is "ema"); raw/... the
# trained weights beside an EMA.
EvalRow = TypedDict(
    "EvalRow",
    {
        "iteration": Required[int],
        "wall": float,
        "flops_total": int,
        "reward_images_total": int,
        "reward_mean": Required[float],
        "reward_sem": float,
        "prompts": int,
        "samples": int,
        "raw/reward_mean": float,
        "raw/reward_sem": float,
        "weights": str,  # "ema" or "trained"
    },
    total=False,
)

NUMBER_PREFIXES = (
    "rewards/",
    "raw/",
    "ms_per_image/",
    "mfu/",
    "monitor/",
    "drift/",
)  # the rows' numbers under per-name keys


def _numbers(row_type: Any) -> set[str]:
    return {k for k, t in get_type_hints(row_type).items() if t in (int, float)}


NUMBER_FIELDS = _numbers(MetricsRow) | _numbers(EvalRow)  # checked on read: a number where the row has one


def add_fields(row: MetricsRow, fields: Mapping[str, Any]) -> None:
    """Fields under per-name keys (NUMBER_PREFIXES) or computed as a mapping, added to a row in their order."""
    cast(dict[str, Any], row).update(fields)


def _check_fields(row: dict[str, Any]) -> str | None:
    """What is wrong with a row (None: nothing)."""
    it = row.get("iteration")
    if not isinstance(it, int) or isinstance(it, bool) or it < 0:
        return f"iteration is {it!r}, not a whole number >= 0"
    for k, v in row.items():
        numeric = k in NUMBER_FIELDS or k.startswith(NUMBER_PREFIXES)
        if numeric and not is_number(v):
            return f"{k} is {v!r}, not a number"
    seconds = row.get("seconds", {})
    if not isinstance(seconds, dict) or not all(is_number(v) for v in seconds.values()):
        return f"seconds is {seconds!r}, not an object of numbers"
    return None


def _check_metrics_row(row: dict[str, Any], iterations: list[int]) -> str | None:
    bad = _check_fields(row)
    if bad is None and iterations and row["iteration"] <= iterations[-1]:
        return (
            f"iteration {row['iteration']} follows iteration {iterations[-1]}, and the iterations must increase "
            "(did two processes write this run?)"
        )
    return bad


def _check_eval_row(row: dict[str, Any], iterations: list[int]) -> str | None:
    bad = _check_fields(row)
    if bad is None and "reward_mean" not in row:
        return "no reward_mean (the held-out reward)"
    if bad is None and not is_number(row["reward_mean"]):
        return f"reward_mean is {row['reward_mean']!r}, not a number"
    return bad


def _read_jsonl(path: Path, check) -> list[dict[str, Any]]:
    if not os.path.lexists(path):
        return []
    if not path.is_file():
        raise TreegrpoError(f"{path}: not a regular file{dangling_note(path)}")
    contained(path.parent, path, f"run {path.parent}")
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is empty or torn
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            row = loads_json(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "iteration" not in row:
            raise TreegrpoError(
                f"{path}: line {n} is damaged ({line[:40]!r}); the rows after it would be lost — "
                f"repair or delete that line, then resume"
            )
        bad = check(row, [r["iteration"] for r in rows[-1:]])
        if bad:
            raise TreegrpoError(f"{path}: line {n}: {bad}; repair or delete that line")
        rows.append(row)
    return rows


def append_metrics(run: Path, row: MetricsRow) -> None:
    with open(run / METRICS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_evals(run: Path) -> list[EvalRow]:
    return cast(list[EvalRow], _read_jsonl(run / EVALS, _check_eval_row))


def append_eval(run: Path, row: EvalRow) -> None:
    with open(run / EVALS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_evals(run: Path, step: int) -> None:
    """Keep the held-out evaluations made at or before iteration `step`."""
    rows = [r for r in read_evals(run) if r["iteration"] <= step]
    atomic_write(run / EVALS, "".join(json.dumps(r) + "\n" for r in rows).encode())


def truncate_metrics(run: Path, step: int) -> None:
    """Keep the rows of iterations before `step` (those after the checkpoint are recomputed)."""
    rows = [r for r in read_metrics(run) if r["iteration"] < step]
    atomic_write(run / METRICS, "".join(json.dumps(r) + "\n" for r in rows).encode())


def tenth_means(rows: list[MetricsRow]) -> tuple[float, float]:
    """Mean reward of the first and of the last tenth of the iterations (at least one each)."""
    if not rows:
        return math.nan, math.nan
    k = max(1, len(rows) // 10)
    first = sum(r.get("reward_mean", math.nan) for r in rows[:k]) / k
    last = sum(r.get("reward_mean", math.nan) for r in rows[-k:]) / k
    return first, last


STALL_ITERATIONS = 5  # this many iterations in a row without a trained edge is worth a warning


def stalled(row: MetricsRow) -> bool:
    """No edge with a non-zero advantage was trained: every group tied, no gradient."""
    return row.get("trained_edges", 0) == 0 or row.get("adv_abs_max", 0.0) == 0.0


def stall_message(first: int, last: int) -> str:
    return (
        f"warning: iterations {first}-{last} trained nothing: every group's leaves scored the same, so no "
        "advantage and no gradient; the reward cannot tell the samples apart (collapsed model, saturated reward?)"
    )


def stall_runs(rows: list[MetricsRow]) -> list[list[int]]:
    """[first, last] iteration of every run of at least STALL_ITERATIONS stalled iterations."""
    runs, start = [], None
    for i in range(len(rows) + 1):
        if i < len(rows) and stalled(rows[i]):
            start = rows[i]["iteration"] if start is None else start
        else:
            if start is not None and rows[i - 1]["iteration"] - start + 1 >= STALL_ITERATIONS:
                runs.append([start, rows[i - 1]["iteration"]])
            start = None
    return runs


def heldout_summary(evals: list[EvalRow]) -> dict[str, Any]:
    """heldout_before / heldout_after: the eval prompts' mean reward at the first and last evaluation."""
    if not evals:
        return {}
    out = {"heldout_before": evals[0]["reward_mean"], "heldout_before_iteration": evals[0]["iteration"]}
    if len(evals) > 1:
        out.update(
            heldout_after=evals[-1]["reward_mean"],
            heldout_after_iteration=evals[-1]["iteration"],
            heldout_gain=evals[-1]["reward_mean"] - evals[0]["reward_mean"],
        )
    return out
