from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from .common import DEVICE_HELP, command_line, err, guarded, parse_numbers, print_json, progress_bar

ADVANTAGES = Path(__file__).resolve().parents[1] / "engine" / "advantages.py"


def declared_estimators(source: Path = ADVANTAGES) -> list[str]:
    """The advantage estimators that engine/advantages.py registers (`@estimator("name", ...)`), read from its source:
    the module loads torch and the CLI's help does not (tests/test_extension_points.py checks them against the
    registry)."""
    return re.findall(r'^@estimator\(\s*"([^"]+)"', source.read_text(encoding="utf-8"), re.M)


def score(
    trees: Annotated[Path, typer.Argument(help="A tree folder written by `treegrpo rollout`.")],
    reward: Annotated[
        str | None, typer.Option(help="Reward name(s), comma separated (default: the rollout config's).")
    ] = None,
    weights: Annotated[
        str | None, typer.Option(help="Weights of the rewards, comma separated (default 1 each).")
    ] = None,
    combine: Annotated[
        str | None,
        typer.Option(help="'rewards' (weighted sum of scores) or 'advantages' (of per-reward advantages)."),
    ] = None,
    estimator: Annotated[
        str | None,
        typer.Option(help=f"{' | '.join(declared_estimators())} (default: the rollout preset's)."),
    ] = None,
    reward_opt: Annotated[
        list[str] | None,
        typer.Option(
            "--reward-opt",
            help="A reward option NAME.KEY=VALUE, e.g. shapes.kind=soft (repeatable; replaces the rollout config's).",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a reward.*, advantage.* or pruning.* key (repeatable)."),
    ] = None,
    iteration: Annotated[
        int | None,
        typer.Option(min=0, help="Training iteration, for the pruning schedules (default: the rollout's)."),
    ] = None,
    max_iterations: Annotated[
        int | None,
        typer.Option(
            min=1, help="Iterations of the run, for pruning.active_until (default: the config's train.iterations)."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (the reward models).")] = "auto",
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Score every leaf image; write rewards, advantages and trained-edge masks beside the trees.

    Rewards, their options and the estimator default to the rollout's config, so the result is what
    `treegrpo train` computes for the same trees.

    Examples:

      treegrpo score runs/trees --reward jpeg-compressibility --estimator branch

      treegrpo score runs/flux-trees --reward hps,pick --weights 0.7,0.3
    """
    from ..preflight import resolve_device
    from ..rewards.base import parse_rewards
    from ..training.stages import ScoreRequest, run_score

    with guarded():
        device = resolve_device(device)
        sets = list(set_ or [])
        if reward is not None:
            names = list(parse_rewards(reward, weights))
            sets.append(f"reward.names={json.dumps(names)}")
        if reward is not None:
            sets.append(f"reward.weights={json.dumps(list(parse_rewards(reward, weights).values()))}")
        elif weights is not None:
            sets.append(f"reward.weights={json.dumps(parse_numbers(weights, '--weights'))}")
        sets += [f"reward.combine={json.dumps(combine)}"] if combine else []
        sets += [f"reward.options={json.dumps(list(reward_opt))}"] if reward_opt else []
        sets += [f"advantage.estimator={json.dumps(estimator)}"] if estimator else []
        req = ScoreRequest(trees, sets, iteration, max_iterations, device=device, command=command_line())
        with progress_bar() as bar:
            summary = run_score(req, bar)
    if json_:
        print_json(summary)
    else:
        err.print(
            f"scored {summary['leaves']} leaves: reward {summary['reward_mean']:.4f} "
            f"± {summary['reward_std']:.4f}; {summary['trained_edges']} trained edges ({summary['estimator']})"
        )
