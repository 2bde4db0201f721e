"""What the reward-hacking guard's monitors cost on the embedded world: per iteration and per held-out evaluation.

    python bench/monitor_cost.py                # 3 repeats each; writes bench/results/monitor_cost.json and .md

CPU time of this process (time.process_time, one thread), so the figures hold on a loaded machine:
- an iteration of `treegrpo train`'s default (tree-grpo-mean, 16 prompts, 432 leaves) with guard.stats on and off
  (the same seed and iteration: the same work but the statistics of the leaves), and image_stats alone on its leaves;
- a held-out evaluation (the world's 56 prompts x 4 ODE samples) with the guard's Watch (image statistics, pixel
  diversity, `shapes` as a gold reward while training on jpeg-compressibility) and without.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit, machine  # noqa: E402  (bench/ is not a package)

from treegrpo_cli.config import load_config  # noqa: E402
from treegrpo_cli.prompts import load_prompts  # noqa: E402
from treegrpo_cli.rewards.monitors import image_stats  # noqa: E402
from treegrpo_cli.training.guard import Watch  # noqa: E402
from treegrpo_cli.training.heldout import heldout_row  # noqa: E402
from treegrpo_cli.training.sampling import build_rewards, leaf_images, stream_seed  # noqa: E402
from treegrpo_cli.training.trainer import Trainer  # noqa: E402

REPEATS = 3
RESULTS = Path("bench/results")


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def iteration_seconds(stats: bool) -> float:
    """CPU seconds of iteration 1 of the default run (a fresh trainer each time: the same work)."""
    cfg = load_config(None, None, [f"guard.stats={'true' if stats else 'false'}"])
    prompts = load_prompts("shapes-train")
    trainer = Trainer(cfg, "cpu")
    trainer.iteration(prompts, lambda *a: None)  # iteration 0: warm
    return cpu(lambda: trainer.iteration(prompts, lambda *a: None))


def leaf_stats_seconds() -> tuple[float, int]:
    """CPU seconds of image_stats on one iteration's leaves (the default tree: 16 prompts x 27 leaves)."""
    cfg = load_config(None, None, [])
    trainer = Trainer(cfg, "cpu")
    prompts = load_prompts("shapes-train")[:16]
    from treegrpo_cli.engine.rollout import TreeConfig, rollout

    tree_cfg = TreeConfig(split_steps=(0, 1, 2), branch=3, sde_steps=(0, 1, 2))
    tree, _ = rollout(trainer.policy, prompts, list(range(16)), trainer.sde, tree_cfg, 0)
    images = leaf_images(trainer.policy, tree)
    return cpu(lambda: image_stats(images)), int(images.shape[0])


def heldout_seconds(watched: bool) -> float:
    cfg = load_config(None, None, ['reward.names=["jpeg-compressibility"]', 'guard.rewards=["shapes"]'])
    trainer = Trainer(cfg, "cpu")
    prompts = load_prompts("shapes-test")
    gold = build_rewards(cfg.reward, "cpu", names=["shapes"])

    def go() -> None:
        heldout_row(
            trainer.policy,
            trainer.sde,
            prompts,
            trainer.rewards,
            trainer.weights,
            ema=None,
            samples=4,
            seed=stream_seed(cfg.seed, "heldout"),
            watch=(lambda: Watch(cfg.guard, gold)) if watched else None,
        )

    return cpu(go)


def main() -> None:
    torch.set_num_threads(1)
    runs = {
        "iteration_guard_on": [iteration_seconds(True) for _ in range(REPEATS)],
        "iteration_guard_off": [iteration_seconds(False) for _ in range(REPEATS)],
        "heldout_watched": [heldout_seconds(True) for _ in range(REPEATS)],
        "heldout_plain": [heldout_seconds(False) for _ in range(REPEATS)],
    }
    stats = [leaf_stats_seconds() for _ in range(REPEATS)]
    med = {k: statistics.median(v) for k, v in runs.items()}
    leaf = statistics.median(s for s, _ in stats)
    out = {
        "commit": commit(),
        "machine": machine(),
        "repeats": REPEATS,
        "cpu_seconds": runs,
        "leaf_stats_seconds": [s for s, _ in stats],
        "leaves": stats[0][1],
        "median": med,
        "leaf_stats_share_of_iteration": leaf / med["iteration_guard_off"],
        "iteration_overhead_share": med["iteration_guard_on"] / med["iteration_guard_off"] - 1,
        "heldout_monitor_seconds": med["heldout_watched"] - med["heldout_plain"],
        "heldout_overhead_share": med["heldout_watched"] / med["heldout_plain"] - 1,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "monitor_cost.json").write_text(json.dumps(out, indent=1) + "\n")
    md = [
        "| what | CPU seconds (median of 3) |",
        "|---|---|",
        f"| an iteration of the default run, guard.stats off | {med['iteration_guard_off']:.3f} |",
        f"| the same iteration, guard.stats on | {med['iteration_guard_on']:.3f} |",
        f"| image_stats on its {out['leaves']} leaves alone | {leaf:.4f} "
        f"({out['leaf_stats_share_of_iteration']:.2%} of the iteration) |",
        f"| a held-out evaluation (56 prompts x 4), no monitors | {med['heldout_plain']:.3f} |",
        f"| the same with the guard's monitors (statistics, pixel diversity, shapes as gold) | "
        f"{med['heldout_watched']:.3f} (+{out['heldout_monitor_seconds']:.3f}) |",
    ]
    (RESULTS / "monitor_cost.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
