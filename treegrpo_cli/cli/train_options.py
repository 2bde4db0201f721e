"""What `train`'s options (shared with `rollout` and `config show`) make of themselves: --set items."""

from __future__ import annotations

import json

from ..errors import TreegrpoError
from .common import parse_numbers

DEFAULT_PRESET = "tree-grpo-mean"


def train_sets(set_, model, reward, weights, iterations, seed, max_batch, reward_opt=None) -> list[str]:
    sets = list(set_ or [])
    sets += [f"model={json.dumps(model)}"] if model else []
    if reward is not None:  # --reward '' or ',' names no reward: the config refuses the empty list
        names = [n.strip() for n in reward.split(",") if n.strip()]
        sets.append("reward.names=[" + ", ".join(json.dumps(n) for n in names) + "]")
    sets += [f"reward.weights={json.dumps(parse_numbers(weights, '--weights'))}"] if weights else []
    sets += ["reward.options=[" + ", ".join(json.dumps(o) for o in reward_opt) + "]"] if reward_opt else []
    sets += [f"train.iterations={iterations}"] if iterations else []
    sets += [f"seed={seed}"] if seed is not None else []
    sets += [f"rollout.max_batch={max_batch}"] if max_batch else []
    return sets


def option_sets(model: str | None = None, reward: str | None = None, iterations: int | None = None) -> list[str]:
    """The --set items train makes of its --model, --reward and --iterations (`config show` takes them too)."""
    return train_sets(None, model, reward, None, iterations, None, None)


def monitor_sets(monitor: str | None) -> list[str]:
    """--monitor's gold rewards as guard.rewards."""
    if monitor is None:
        return []
    names = [n.strip() for n in monitor.split(",") if n.strip()]
    if not names:
        raise TreegrpoError("--monitor takes reward names, comma separated (e.g. --monitor pick,imagereward)")
    return ["guard.rewards=[" + ", ".join(json.dumps(n) for n in names) + "]"]


def log_sets(log: str | None) -> list[str]:
    if log is None:
        return []
    names = [] if log.strip() == "none" else [n.strip() for n in log.split(",") if n.strip()]
    if not names and log.strip() != "none":
        raise TreegrpoError("--log takes tensorboard, wandb, both (comma separated), or none")
    return ["train.log=[" + ", ".join(json.dumps(n) for n in names) + "]"]


def policy_sets(
    revision: str | None = None,
    finetune: str | None = None,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | None = None,
    dtype: str | None = None,
    gradient_checkpointing: bool | None = None,
) -> list[str]:
    """--set items of the [policy] section from the model options (shared with `rollout`)."""
    sets = [f"policy.revision={json.dumps(revision)}"] if revision else []
    sets += [f"policy.finetune={json.dumps(finetune)}"] if finetune else []
    sets += [f"policy.lora_rank={lora_rank}"] if lora_rank else []
    sets += [f"policy.lora_alpha={lora_alpha}"] if lora_alpha is not None else []
    if lora_targets:
        names = [n.strip() for n in lora_targets.split(",") if n.strip()]
        sets.append("policy.lora_targets=[" + ", ".join(json.dumps(n) for n in names) + "]")
    sets += [f"policy.dtype={json.dumps(dtype)}"] if dtype else []
    if gradient_checkpointing is not None:
        sets.append(f"policy.gradient_checkpointing={str(gradient_checkpointing).lower()}")
    return sets
