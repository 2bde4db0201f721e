from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import config_from_dict
from ..rewards.base import parse_rewards
from ..stages import ScoreRequest, run_score
from ..store.trees import open_trees
from .common import err, guarded, print_json, progress_bar


def score(
    trees: Annotated[Path, typer.Argument(help="A tree folder written by `treegrpo rollout`.")],
    reward: Annotated[Optional[str], typer.Option(help="Reward name(s), comma separated (default: the rollout config's).")] = None,
    weights: Annotated[Optional[str], typer.Option(help="Weights of the rewards, comma separated (default 1 each).")] = None,
    combine: Annotated[Optional[str], typer.Option(help="'rewards' (weighted sum of scores) or 'advantages' (of per-reward advantages).")] = None,
    estimator: Annotated[Optional[str], typer.Option(help="flat | branch | treegrpo | treepo (default: the rollout preset's).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override an advantage.* or pruning.* key (repeatable).")] = None,
    iteration: Annotated[int, typer.Option(min=0, help="Training iteration, for the pruning schedules.")] = 0,
    max_iterations: Annotated[int, typer.Option(min=1, help="Iterations of the run, for pruning.active_until.")] = 1,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Score every leaf image; write rewards, advantages and trained-edge masks beside the trees.

    Example: treegrpo score runs/trees --reward jpeg-compressibility --estimator branch
    """
    with guarded():
        store = open_trees(trees)
        overrides = {"advantage.estimator": estimator} if estimator else {}
        cfg = config_from_dict(store.meta["config"], set_ or [], overrides)
        names = reward or ",".join(cfg.reward.names)
        if weights is None and reward is None and cfg.reward.weights:
            weights = ",".join(str(w) for w in cfg.reward.weights)
        req = ScoreRequest(trees, parse_rewards(names, weights), combine or cfg.reward.combine,
                           cfg.advantage, cfg.pruning, iteration, max_iterations)
        with progress_bar() as bar:
            summary = run_score(req, bar)
    if json_:
        print_json(summary)
    else:
        err.print(f"scored {summary['leaves']} leaves: reward {summary['reward_mean']:.4f} "
                  f"± {summary['reward_std']:.4f}; {summary['trained_edges']} trained edges ({summary['estimator']})")
