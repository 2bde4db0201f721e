"""A readable view of a tree folder: every node, its edge, reward and advantage; summaries per depth."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..config import config_from_dict
from ..errors import CorruptFileError, TreegrpoError
from ..store.shards import INDEX
from ..store.trees import open_trees, read_extra, read_tree_shard
from ..training.steps import group_spread


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)


def inspect_trees(root: Path, with_nodes: bool = True) -> dict[str, Any]:
    """{"trees": [{"tree", "prompt", "nodes": [...]}], "meta": {...}, "depths": [...]} for a tree folder.
    The index is validated as a whole first (open_trees), its config too: meta.config is the rollout's
    config as a complete, valid dict."""
    store = open_trees(root)
    try:
        config = config_from_dict(store.meta["config"]).to_dict()
    except TreegrpoError as e:
        raise CorruptFileError(f"{store.root / INDEX}: meta.config: {e}") from None
    trees: list[dict[str, Any]] = []
    per_depth: dict[int, dict[str, Any]] = {}  # counts, sigma, and [n, sum, sum of squares] accumulators
    leaf_rewards, leaf_groups = [], []  # every leaf's total reward and prompt group, for the group spread
    for name in store.names("trees"):
        s = read_tree_shard(store, name)
        rew = read_extra(store, "rewards", s.index)
        adv = read_extra(store, "advantages", s.index)
        reward = rew[0]["reward"] if rew else None
        trees += _tree_rows(s, reward, adv[0] if adv else None, with_nodes)
        _depth_stats(per_depth, s, reward, adv[0] if adv else None)
        if reward is not None:
            leaves = s.tree.leaves()
            leaf_rewards.append(reward[leaves])
            leaf_groups.append(s.tree.group()[leaves])
    meta = dict(store.meta)
    meta["config"] = config
    meta["num_trees"] = len(trees)
    depths = [dict(depth=d, **_finish(v)) for d, v in sorted(per_depth.items())]
    groups = group_spread(torch.cat(leaf_rewards), torch.cat(leaf_groups)) if leaf_rewards else None
    return {"trees": trees, "meta": meta, "depths": depths, "groups": groups}


def _tree_rows(s, reward, adv, with_nodes: bool) -> list[dict[str, Any]]:
    t = s.tree
    rows = []
    for b in range(t.num_trees):
        ids = torch.nonzero(t.tree == b).flatten().tolist()
        local = {n: i for i, n in enumerate(ids)}  # shard node id -> tree-local id (root 0, breadth-first)
        entry: dict[str, Any] = {
            "tree": s.tree_offset + b,
            "prompt": s.prompts[int(t.tree_prompt[b])],
            "num_nodes": len(ids),
        }
        if with_nodes:
            entry["nodes"] = [_node(t, n, local, reward, adv) for n in ids]
        rows.append(entry)
    return rows


def _node(t, n: int, local: dict[int, int], reward, adv) -> dict[str, Any]:
    """One node; ids are local to the tree (root 0, breadth-first, dense)."""
    p = int(t.parent[n])
    has_adv = adv is not None and bool(adv["valid"][n])
    return {
        "id": local[n],
        "parent": None if p < 0 else local[p],
        "depth": int(t.depth[n]),
        "sigma": round(float(t.sigma[n]), 6),
        "sde": bool(t.sde[n]),
        "log_prob": None if p < 0 or not bool(t.sde[n]) else _num(float(t.log_prob[n])),
        "reward": None if reward is None else _num(float(reward[n])),
        "advantage": round(float(adv["advantage"][n]), 6) if has_adv else None,
        "trained": bool(adv["trained"][n]) if adv is not None else False,
    }


def _depth_stats(acc: dict[int, dict[str, Any]], s, reward, adv) -> None:
    """Per depth: nodes, SDE edges, trained edges; sums for the mean and std of the rewards found there
    (leaves) and of the advantages of the edges into it."""
    t = s.tree
    for d in torch.unique(t.depth).tolist():
        m = t.depth == d
        row = acc.setdefault(
            d,
            {
                "nodes": 0,
                "sde_edges": 0,
                "trained": 0,
                "sigma": float(t.sigma[m][0]),
                "_r": [0, 0.0, 0.0],
                "_a": [0, 0.0, 0.0],
            },
        )
        row["nodes"] += int(m.sum())
        row["sde_edges"] += int((t.sde & m).sum())
        if reward is not None:
            _add(row["_r"], reward[m & ~torch.isnan(reward)])
        if adv is not None:
            row["trained"] += int((adv["trained"] & m).sum())
            _add(row["_a"], adv["advantage"][m & adv["valid"]])


def _add(acc: list, x: torch.Tensor) -> None:
    x = x.double()
    acc[0] += x.numel()
    acc[1] += float(x.sum())
    acc[2] += float((x * x).sum())


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not k.startswith("_")}
    for key, (n, s1, s2) in (("reward", row["_r"]), ("advantage", row["_a"])):
        mean = s1 / n if n else None
        out[f"{key}_mean"] = None if mean is None else round(mean, 6)
        out[f"{key}_std"] = None if mean is None else round(math.sqrt(max(s2 / n - mean * mean, 0.0)), 6)
    return out
