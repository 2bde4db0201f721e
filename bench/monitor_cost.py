"""What the reward-hacking guard's monitors cost on the embedded world: per iteration and per held-out evaluation.

    python bench/monitor_cost.py                # 3 repeats each; writes bench/results/monitor_cost.json and .md

CPU time of this process (time.process_time, one thread), so the figures hold on a loaded machine:
- an iteration of `treegrpo train`'s default (tree-grpo-mean: 16 prompts, 432 leaves), and within it the image
  statistics of its leaves (guard.stats; timed where the trainer calls them);
- a held-out evaluation (the world's 56 prompts x 4 ODE samples, trained on jpeg-compressibility), and within it
  the guard's monitors of its images (image statistics, pixel diversity and `shapes` as a gold reward).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit, machine  # noqa: E402  (bench/ is not a package)

from treegrpo_cli.config import load_config  # noqa: E402
from treegrpo_cli.prompts import load_prompts  # noqa: E402
from treegrpo_cli.rewards.monitors import image_stats  # noqa: E402
from treegrpo_cli.training import guard, trainer  # noqa: E402
from treegrpo_cli.training.heldout import heldout_row  # noqa: E402
from treegrpo_cli.training.sampling import stream_seed  # noqa: E402

REPEATS = 3
RESULTS = Path("bench/results")
PRESET = "tree-grpo-mean"  # `treegrpo train`'s default


class Timed:
    """Wraps a function; adds the CPU seconds of its calls to .seconds."""

    def __init__(self, fn: Any):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - t


def iteration() -> tuple[float, float]:
    """(CPU seconds of iteration 1 of the default run, of the leaves' image statistics within it)."""
    cfg = load_config(PRESET, None, [])
    prompts = load_prompts("shapes-train")
    t = trainer.Trainer(cfg, "cpu")
    t.iteration(prompts, lambda *a: None)  # iteration 0: warm
    timed = Timed(image_stats)
    trainer.image_stats = timed  # type: ignore[assignment]  # the name the trainer calls
    try:
        start = time.process_time()
        t.iteration(prompts, lambda *a: None)
        return time.process_time() - start, timed.seconds
    finally:
        trainer.image_stats = image_stats


def heldout() -> tuple[float, float]:
    """(CPU seconds of a held-out evaluation with the guard's monitors, of the monitors within it)."""
    cfg = load_config(PRESET, None, ['reward.names=["jpeg-compressibility"]', 'guard.rewards=["shapes"]'])
    t = trainer.Trainer(cfg, "cpu")
    see = Timed(guard.Watch.see)

    def watch() -> guard.Watch:
        w = guard.Watch(cfg.guard, t.gold)
        w.see = lambda chunk: see(w, chunk)  # type: ignore[method-assign]
        return w

    start = time.process_time()
    heldout_row(
        t.policy, t.sde, load_prompts("shapes-test"), t.rewards, t.weights, ema=None, samples=4,
        seed=stream_seed(cfg.seed, "heldout"), watch=watch,
    )  # fmt: skip
    return time.process_time() - start, see.seconds


def table(out: dict[str, Any]) -> str:
    """The results file as a markdown table (bench/results_page.py draws it too)."""
    med = statistics.median
    it, leaf = med(out["iteration_cpu_seconds"]), med(out["leaf_stats_cpu_seconds"])
    ev, mon = med(out["heldout_cpu_seconds"]), med(out["heldout_monitor_cpu_seconds"])
    lines = [
        f"| what (the world, `{out['preset']}`) | CPU seconds, median of {out['repeats']} | share |",
        "|---|---|---|",
        f"| an iteration (16 prompts, 432 leaves), guard on | {it:.3f} | |",
        f"| its leaves' image statistics | {leaf:.4f} | {leaf / it:.2%} of the iteration |",
        f"| a held-out evaluation (56 prompts x 4 ODE samples) | {ev:.3f} | |",
        f"| its monitors (statistics, pixel diversity, `shapes` as gold) | {mon:.4f} | {mon / ev:.2%} of it |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    torch.set_num_threads(1)
    its = [iteration() for _ in range(REPEATS)]
    evals = [heldout() for _ in range(REPEATS)]
    med = statistics.median
    it, leaf = med([a for a, _ in its]), med([b for _, b in its])
    ev, mon = med([a for a, _ in evals]), med([b for _, b in evals])
    out = {
        "commit": commit(),
        "machine": machine(),
        "preset": PRESET,
        "repeats": REPEATS,
        "iteration_cpu_seconds": [a for a, _ in its],
        "leaf_stats_cpu_seconds": [b for _, b in its],
        "heldout_cpu_seconds": [a for a, _ in evals],
        "heldout_monitor_cpu_seconds": [b for _, b in evals],
        "leaf_stats_share_of_iteration": leaf / it,
        "monitor_share_of_heldout": mon / ev,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "monitor_cost.json").write_text(json.dumps(out, indent=1) + "\n")
    md = table(out)
    (RESULTS / "monitor_cost.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
