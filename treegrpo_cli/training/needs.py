"""Pre-flight: every name and file a command will need, checked before any weights load and before anything is
printed; whatever is missing is named in ONE error line.

What is checked: each model (--model, a checkpoint's, --baseline) names a model the registry knows (a typo gets the
name meant, in any case or hub spelling) and its files are there (a weights file, or a diffusers snapshot complete
with its text encoders: models/registry.py check_available; a gated hub repository says how to get access); each
reward (--reward, --metric) is known, its options are its own, and its model's weight files are where the loader
looks (rewards/weights.py). Each finding keeps its own message (what to fetch, the option or environment variable
that points at a local copy); several are joined into one line, numbered. Nothing is loaded or downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError, TreegrpoError, shown
from ..models.base import PolicyConfig


@dataclass(frozen=True)
class ModelNeed:
    """One model a command will load: its name, [policy] section and the option that named it (a label for the
    message: "" for the command's own model, whose messages already say --model)."""

    name: str
    opts: PolicyConfig
    label: str = ""


def missing(
    models: Sequence[ModelNeed], rewards: Iterable[str], options: dict[str, dict[str, str]] | None = None
) -> list[TreegrpoError]:
    """Every problem found with the models and rewards a command needs, in that order (empty: all there)."""
    from ..models.registry import check_available

    found: list[TreegrpoError] = []
    for m in models:
        try:
            check_available(m.name, m.opts)
        except TreegrpoError as e:
            found.append(
                (ConfigError if isinstance(e, ConfigError) else TreegrpoError)(f"{m.label}: {e}") if m.label else e
            )
    return found + _reward_problems(list(dict.fromkeys(rewards)), options or {})


def _reward_problems(names: list[str], options: dict[str, dict[str, str]]) -> list[TreegrpoError]:
    from ..rewards.base import check_rewards, check_weights

    found: list[TreegrpoError] = []
    for name in names:
        own = {name: options.get(name, {})}
        try:
            check_rewards([name], own)  # the name and its options
            check_weights([name], own)  # its model's weight files
        except TreegrpoError as e:
            found.append(e)
    stray = sorted(set(options) - set(names))
    if stray:
        found.append(ConfigError(f"reward options for {shown(stray[0])}, which the reward list does not name"))
    return found


def one_error(found: Sequence[TreegrpoError]) -> TreegrpoError | None:
    """None for no problem; one problem as it is; several as one line, numbered (a ConfigError, exit 2, when any
    is a config error such as an unknown name; else a TreegrpoError)."""
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    cls = ConfigError if any(isinstance(e, ConfigError) for e in found) else TreegrpoError
    items = " ".join(f"({i}) {str(e).rstrip('.')}{'' if i == len(found) else ';'}" for i, e in enumerate(found, 1))
    return cls(f"{len(found)} things this command needs are missing or wrong (nothing was loaded): {items}")


def check(
    models: Sequence[ModelNeed], rewards: Iterable[str], options: dict[str, dict[str, str]] | None = None
) -> None:
    """Raise one error naming everything `missing` finds."""
    error = one_error(missing(models, rewards, options))
    if error is not None:
        raise error


def train_missing(cfg) -> list[TreegrpoError]:
    """What a training run of `cfg` needs and lacks: its model and every reward (with the config's options)."""
    from ..rewards.base import parse_reward_options

    try:
        options = parse_reward_options(cfg.reward.options)
    except TreegrpoError as e:  # an option of an unknown reward: named with the rest
        return [e, *missing([ModelNeed(cfg.model, cfg.policy)], [])]
    gold = cfg.guard.rewards if cfg.guard.enabled else ()  # the guard's gold rewards load with the run's
    return missing([ModelNeed(cfg.model, cfg.policy)], (*cfg.reward.names, *gold), options)


def check_train(cfg) -> None:
    """A training run's pre-flight: one error line naming everything its config needs and lacks."""
    error = one_error(train_missing(cfg))
    if error is not None:
        raise error
