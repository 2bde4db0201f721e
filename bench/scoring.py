"""How long the per-iteration bookkeeping takes on the CPU: the `shapes` reward on a batch of images and
every advantage estimator on a batch of dense trees (both should stay far below a rollout's cost).

    python bench/scoring.py [--repeat 5] [--images 256] [--trees 64]

Median seconds over --repeat calls (after one warm-up call); writes bench/results/scoring.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from treegrpo_cli.engine.advantages import AdvantageConfig, estimate
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.world.shapes import all_prompts, render_prompts

ESTIMATORS = {
    "flat": AdvantageConfig("flat"),
    "branch": AdvantageConfig("branch"),
    "branch-path-weighted": AdvantageConfig("branch", beta=1.0),
    "branch-recursive": AdvantageConfig("branch", beta=1.0, weighting="recursive"),
    "treegrpo": AdvantageConfig("treegrpo"),
    "treepo": AdvantageConfig("treepo"),
}


def median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dense_trees(n_trees: int, branch: int = 2, levels: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """n_trees complete `branch`-ary trees of `levels` splits (16 leaves each by default), two per group:
    estimate's keywords parent, depth, tree, group, reward, log_prob, all [N], rewards on the leaves only."""
    size = sum(branch**level for level in range(levels + 1))  # heap order: node i's parent is (i-1)//branch
    parent, depth = [-1], [0]
    for i in range(1, size):
        parent.append((i - 1) // branch)
        depth.append(depth[parent[i]] + 1)
    p1, d1 = torch.tensor(parent), torch.tensor(depth)
    tree = torch.arange(n_trees).repeat_interleave(size)
    par = torch.where(p1.repeat(n_trees) >= 0, p1.repeat(n_trees) + tree * size, -1)
    gen = torch.Generator().manual_seed(seed)
    reward = torch.full((n_trees * size,), float("nan"), dtype=torch.float64)
    leaf = (d1 == levels).repeat(n_trees)
    reward[leaf] = torch.rand(int(leaf.sum()), generator=gen, dtype=torch.float64)
    log_prob = -1.0 + 0.05 * torch.randn(n_trees * size, generator=gen, dtype=torch.float64)
    log_prob[par < 0] = float("nan")
    return {
        "parent": par,
        "depth": d1.repeat(n_trees),
        "tree": tree,
        "group": tree // 2,
        "reward": reward,
        "log_prob": log_prob,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--trees", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("bench/results/scoring.json"))
    args = ap.parse_args()
    prompts = random.Random(8).sample(all_prompts(), args.images)  # every form of prompt
    images, shapes = render_prompts(prompts, 9), get_reward("shapes")
    result = {f"shapes reward, {args.images} images": median_seconds(lambda: shapes(images, prompts), args.repeat)}
    trees = dense_trees(args.trees)
    nodes = trees["parent"].numel() // args.trees
    for name, cfg in ESTIMATORS.items():
        result[f"{name} advantages, {args.trees} trees of {nodes} nodes"] = median_seconds(
            lambda cfg=cfg: estimate(cfg, **trees), args.repeat
        )
    for name, s in result.items():
        print(f"{name:56s} {s * 1000:8.1f} ms")
    meta = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "loadavg_1m": os.getloadavg()[0],
        "repeat": args.repeat,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seconds": result, **meta}, indent=2) + "\n")


if __name__ == "__main__":
    main()
