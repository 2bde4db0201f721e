"""How well can a split foresee a tie? The dynamic rollout's heuristics against the fixed tree's own outcomes.

    python bench/tie_prediction.py                                  # branch-mix-flow on the embedded world
    python bench/tie_prediction.py --preset treepo --out bench/results/tie_prediction-treepo.json

Rolls out the preset's fixed trees from the shipped weights, recording each frontier node's x0-prediction at every
split after the first (where tree.dynamic decides: engine/dynamic.py), scores the leaves, then asks each heuristic
which nodes it would stop: `reward` (the x0-prediction's reward, tolerance 0, the study's dynamic-reward) and
`distance` at the study's tolerances. A stop predicts that the node's subtree repeats its leader's outcome; it is
right when every leaf under the two has one reward. The base rate beside it: any node of a frontier against the
first node of its tree's. Per tree: the frontier as one cluster (every node stops) against the prompt's group tying
(no advantage for any of its leaves). Writes JSON and a markdown table beside it (.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit  # noqa: E402  (bench/ is not a package)

from treegrpo_cli.config import load_config  # noqa: E402
from treegrpo_cli.engine.dynamic import distance_values, tie_leaders  # noqa: E402
from treegrpo_cli.engine.rollout import rollout  # noqa: E402
from treegrpo_cli.rewards.base import score_leaves, weighted_sum  # noqa: E402
from treegrpo_cli.training.sampling import leaf_images, make_judge  # noqa: E402
from treegrpo_cli.training.trainer import Trainer  # noqa: E402
from treegrpo_cli.world.shapes import load_split  # noqa: E402

HEURISTICS = (("reward", 0.0), ("distance", 0.4), ("distance", 0.1))  # the study's dynamic-reward, -distance, treepo's
EPS = 1e-6  # rewards this close are one outcome
KEYS = ("nodes", "trees", "stops", "right", "pairs", "base", "one", "one_tied")


def recorded_rollout(tr: Trainer, prompts: list[str], seed: int) -> tuple[Any, list[tuple[torch.Tensor, int]]]:
    """The preset's fixed trees, and each judge call of a dynamic rollout that stops nothing: (x0-predictions of one
    tree's frontier [F, ...], its split step), in the order the rollout makes them."""
    splits, calls = sorted(tr.cfg.tree.split_steps), list[tuple[torch.Tensor, int]]()
    trees = len(prompts) * tr.cfg.tree.trees_per_prompt

    def recorder(x0: torch.Tensor, ps: list[str]) -> torch.Tensor:
        calls.append((x0.detach().cpu().clone(), splits[1 + len(calls) // trees]))
        return torch.arange(len(ps), dtype=torch.float64)  # every node its own cluster: no stop, the fixed tree

    cfg, ids = replace(tr.cfg.tree, dynamic="reward", stop_tol=0.0), list(range(len(prompts)))
    tree, _ = rollout(tr.policy, prompts, ids, tr.sde, cfg, seed, judge=recorder, max_batch=tr.cfg.rollout.max_batch)
    fixed, _ = rollout(tr.policy, prompts, ids, tr.sde, tr.cfg.tree, seed, max_batch=tr.cfg.rollout.max_batch)
    if not torch.equal(tree.latent, fixed.latent):
        raise RuntimeError("the recording rollout is not the fixed tree")
    return fixed, calls


def outcome_ranges(tree, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] the lowest and highest leaf reward under every node (children come after their parents)."""
    lo, hi = torch.full((tree.num_nodes,), float("inf")), torch.full((tree.num_nodes,), float("-inf"))
    leaves = tree.leaves()
    lo[leaves], hi[leaves] = rewards, rewards
    for n in range(tree.num_nodes - 1, 0, -1):
        p = int(tree.parent[n])
        lo[p], hi[p] = min(lo[p], lo[n]), max(hi[p], hi[n])
    return lo, hi


def count(tree, calls, lo, hi, group_tied: dict[int, bool], values_of, tol: float, out: dict) -> None:
    """Add one batch's stops, their hits and the base rate to out[split step] for one heuristic; values_of(x0, t):
    the heuristic's values of tree t's frontier."""
    for k, (x0, step) in enumerate(calls):
        t = k % tree.num_trees
        nodes = torch.nonzero((tree.tree == t) & (tree.depth == step)).flatten().tolist()
        if len(nodes) != len(x0):
            raise RuntimeError(f"tree {t} at step {step}: {len(nodes)} nodes, {len(x0)} x0-predictions")
        leader = tie_leaders(values_of(x0, t), [t] * len(nodes), tol)
        tied = lambda a, b: float(max(hi[a], hi[b]) - min(lo[a], lo[b])) <= EPS  # noqa: E731
        c = out.setdefault(step, dict.fromkeys(KEYS, 0))
        c["nodes"], c["trees"] = c["nodes"] + len(nodes), c["trees"] + 1
        c["stops"] += sum(x >= 0 for x in leader)
        c["right"] += sum(tied(nodes[i], nodes[x]) for i, x in enumerate(leader) if x >= 0)
        c["pairs"] += len(nodes) - 1
        c["base"] += sum(tied(n, nodes[0]) for n in nodes[1:])
        one = sum(x < 0 for x in leader) == 1 and len(nodes) > 1
        c["one"] += one
        c["one_tied"] += one and group_tied[int(tree.tree_prompt[t])]


def judged(judge: Callable, names: list[str], x0: torch.Tensor, t: int) -> torch.Tensor:
    """The reward of tree t's x0-predictions (names: each tree's prompt)."""
    return judge(x0, [names[t]] * len(x0))


def rates(c: dict) -> dict[str, float | None]:
    def div(a: int, b: int) -> float | None:
        return a / b if b else None

    return {
        "nodes": c["nodes"],
        "stopped": div(c["stops"], c["nodes"]),
        "right_when_stopped": div(c["right"], c["stops"]),
        "base_rate": div(c["base"], c["pairs"]),
        "trees": c["trees"],
        "one_cluster": div(c["one"], c["trees"]),
        "group_tied_when_one_cluster": div(c["one_tied"], c["one"]),
    }


def measure(preset: str, num_prompts: int, batches: int) -> dict[str, Any]:
    cfg = load_config(preset, sets=['model="tiny-shapes"'])
    tr = Trainer(cfg, "cpu")
    judge = make_judge(replace(cfg.tree, dynamic="reward"), cfg.reward, tr.policy, tr.rewards)
    assert judge is not None
    counts: dict[tuple[str, float], dict] = {h: {} for h in HEURISTICS}
    groups = tied_groups = 0
    for b in range(batches):
        prompts = load_split("rl_train")[b * num_prompts :: 7][:num_prompts]
        tree, calls = recorded_rollout(tr, prompts, seed=1000 + b)
        leaf_prompts = [prompts[int(p)] for p in tree.tree_prompt[tree.tree[tree.leaves()]]]
        rewards = weighted_sum(score_leaves(tr.rewards, leaf_images(tr.policy, tree), leaf_prompts), tr.weights)
        lo, hi = outcome_ranges(tree, rewards.float().cpu())
        roots = torch.nonzero(tree.parent < 0).flatten()
        by_prompt: dict[int, list[int]] = {}
        for t, r in enumerate(roots.tolist()):
            by_prompt.setdefault(int(tree.tree_prompt[t]), []).append(r)
        group_tied = {p: float(hi[rs].max() - lo[rs].min()) <= EPS for p, rs in by_prompt.items()}
        groups, tied_groups = groups + len(group_tied), tied_groups + sum(group_tied.values())
        names = [prompts[int(p)] for p in tree.tree_prompt]  # each tree's prompt
        values_of: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
            "reward": partial(judged, judge, names),
            "distance": lambda x0, t: distance_values(x0, [t] * len(x0)),
        }
        for name, tol in HEURISTICS:
            count(tree, calls, lo, hi, group_tied, values_of[name], tol, counts[(name, tol)])

    def summary(by: dict) -> dict:
        return {
            "by_split": {str(s): rates(c) for s, c in sorted(by.items())},
            "all": rates({k: sum(c[k] for c in by.values()) for k in KEYS}),
        }

    return {
        "preset": preset,
        "prompts_per_batch": num_prompts,
        "batches": batches,
        "split_steps": sorted(cfg.tree.split_steps),
        "group_tie_rate": tied_groups / groups,
        "groups": groups,
        "heuristics": [{"heuristic": name, "tol": tol, **summary(counts[(name, tol)])} for name, tol in HEURISTICS],
    }


def markdown(r: dict) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    head = (
        f"`python bench/tie_prediction.py --preset {r['preset']}` ({r['batches']} batches of {r['prompts_per_batch']} "
        f"prompts, the shipped weights): {pct(r['group_tie_rate'])} of the {r['groups']} prompt groups tie.\n\n"
        "| heuristic | split step | frontier nodes | stopped | stop right (subtree ties its leader's) | base rate "
        "(a node ties the first) | tree one cluster | group ties then |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for h in r["heuristics"]:
        name = f"{h['heuristic']} (tol {h['tol']:g})"
        for step, x in [*h["by_split"].items(), ("all", h["all"])]:
            rows.append(
                f"| {name} | {step} | {x['nodes']} | {pct(x['stopped'])} | {pct(x['right_when_stopped'])} "
                f"| {pct(x['base_rate'])} | {pct(x['one_cluster'])} | {pct(x['group_tied_when_one_cluster'])} |"
            )
    return head + "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="branch-mix-flow")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per batch")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tie_prediction.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    result = {**measure(args.preset, args.prompts, args.batches), "commit": commit()}
    result["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
