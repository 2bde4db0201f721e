"""Rollout wall time: a dense BranchGRPO tree batch against a flat rollout of as many leaves.

    python bench/rollout.py [--prompts 8] [--repeats 3] [--max-batch 64] [--threads N] [--out FILE]

Every case rolls out P prompts in one batch, 20 steps, 16 leaves per prompt, with the "pixel"
policy on the CPU and the library's `rollout` (model evaluations as it reports them):
    tree      preset branch, K=2 at steps 0,3,6,9                      203 evals per prompt
    flat      preset branch, the root split into 16 independent chains  305 evals per prompt
              (1 shared forward at step 0, then 16 x 19; DanceGRPO as a tree)
    chains    16 separate single-chain trees, 16 root noises           320 evals per prompt
    tree-mb1  the tree case with max_batch=1 (one node per forward, like the reference codes)
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.rollout import rollout
from treegrpo_cli.engine.sde import FlowSDE
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.prompts import load_prompts

FLAT = ["tree.split_steps=[0]", "tree.branch=16", "tree.branch_s=inf"]
CHAINS = ["tree.split_steps=[]", "tree.trees_per_prompt=16", "tree.init_same_noise=false"]


def cpu_name() -> str:
    name = platform.processor()
    if not name and Path("/proc/cpuinfo").is_file():  # platform.processor() is often empty on Linux
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return name or platform.machine()


def make_case(policy, prompts: list[str], sets: list[str], max_batch: int):
    """A no-argument rollout of all prompts in one batch, and the counts it reports (after a warm-up)."""
    cfg = load_config("branch", sets=sets)
    sde, ids, T = FlowSDE(cfg.sampler), list(range(len(prompts))), cfg.sampler.steps

    def run():
        return rollout(policy, prompts, ids, sde, cfg.tree, cfg.seed, max_batch=max_batch)

    tree, nfe = run()  # warm-up
    leaves = int(tree.leaves().numel())  # P * trees_per_prompt * leaves per tree
    assert leaves == len(prompts) * cfg.tree.trees_per_prompt * cfg.tree.leaves(T)
    assert nfe == len(prompts) * cfg.tree.trees_per_prompt * cfg.tree.model_evals(T) * policy.evals_per_row
    info = {
        "sets": sets,
        "steps": T,
        "prompts": len(prompts),
        "trees": tree.num_trees,
        "leaves_per_prompt": leaves // len(prompts),
        "leaves": leaves,
        "nodes": tree.num_nodes,
        "model_evals": nfe,
        "evals_per_prompt": nfe // len(prompts),
        "max_batch": max_batch,
    }
    return run, info


def time_cases(runs: dict, repeats: int) -> dict[str, list[float]]:
    """Round-robin over the cases, so that load from other processes hits them all alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return times


def print_table(res: dict) -> None:
    print(
        f"torch {res['torch']}, {res['cpu']['processor']}, {res['cpu']['count']} cpus, "
        f"{res['threads']} threads, {res['repeats']} repeats"
    )
    print(
        f"{'case':<9} {'max_batch':>9} {'leaves':>6} {'evals':>6} {'evals/p':>7} "
        f"{'median s':>9} {'min s':>8} {'ms/leaf':>8}"
    )
    for name, c in res["cases"].items():
        print(
            f"{name:<9} {c['max_batch']:>9} {c['leaves']:>6} {c['model_evals']:>6} {c['evals_per_prompt']:>7} "
            f"{c['median_s']:>9.3f} {c['min_s']:>8.3f} {1000 * c['s_per_leaf']:>8.2f}"
        )
    for k, v in res["ratios"].items():
        print(f"{k:<16} {v:.2f}x median   {res['ratios_min'][k]:.2f}x min")


def results(args, cases: dict, load0: tuple) -> dict:
    def ratio(a: str, b: str, key: str) -> float:
        return round(cases[a][key] / cases[b][key], 3)

    pairs = (("flat", "tree"), ("chains", "tree"), ("tree-mb1", "tree"))
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": {"processor": cpu_name(), "machine": platform.machine(), "count": os.cpu_count()},
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "model": "pixel",
        "device": "cpu",
        "loadavg_1m": {"start": round(load0[0], 2), "end": round(os.getloadavg()[0], 2)},  # other processes
        "cases": cases,
        "ratios": {f"{a}/{b}": ratio(a, b, "median_s") for a, b in pairs},  # of the medians
        "ratios_min": {f"{a}/{b}": ratio(a, b, "min_s") for a, b in pairs},  # of the minima
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per rollout batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (median reported)")
    ap.add_argument("--max-batch", type=int, default=64, help="rows per model forward")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/rollout.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy("pixel")
    prompts = load_prompts()[: args.prompts]
    assert len(prompts) == args.prompts, f"only {len(prompts)} embedded prompts"
    runs, cases, load0 = {}, {}, os.getloadavg()
    for name, sets, mb in (
        ("tree", [], args.max_batch),
        ("flat", FLAT, args.max_batch),
        ("chains", CHAINS, args.max_batch),
        ("tree-mb1", [], 1),
    ):
        runs[name], cases[name] = make_case(policy, prompts, sets, mb)
    for name, ts in time_cases(runs, args.repeats).items():
        med = statistics.median(ts)
        cases[name] |= {
            "times_s": [round(t, 4) for t in ts],
            "median_s": round(med, 4),
            "min_s": round(min(ts), 4),
            "s_per_leaf": round(med / cases[name]["leaves"], 6),
        }
    res = results(args, cases, load0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print_table(res)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
