"""`treegrpo config show`: the fully resolved config of a preset, model, file and --set items, and with --explain
the layer each value comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import err, guarded, model_help, one_line, out, print_json

config_app = typer.Typer(help="Show the resolved config and where each value comes from.", no_args_is_help=True)


@config_app.command("show")
def show(
    preset: Annotated[str | None, typer.Option(help="Method preset (default: train's).")] = None,
    model: Annotated[str | None, typer.Option(help=model_help("the preset's"))] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML config file layered over the preset.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override one key (repeatable).")] = None,
    reward: Annotated[str | None, typer.Option(help="Reward name(s), comma separated (as for train).")] = None,
    prompts: Annotated[
        str | None, typer.Option(help="Training prompts: a .txt/.jsonl file or a built-in list (as for train).")
    ] = None,
    iterations: Annotated[int | None, typer.Option(min=1, help="Online iterations (as for train).")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Name the layer each value comes from.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the config a run with these options would use, one `section.key = value` a line.

    Examples:

      treegrpo config show --preset branch-mix-flow --model flux-dev --explain

      treegrpo config show --set train.lr=3e-5 --json
    """
    from ..config import config_layers, load_config, user_warnings
    from .train_options import DEFAULT_PRESET, option_sets

    with guarded():
        # the --set items train makes of the same options, after the user's own (so the options win, as in train)
        given = {
            "--model": option_sets(model=model),
            "--reward": option_sets(reward=reward),
            "--iterations": option_sets(iterations=iterations),
            "--prompts": [f"rollout.prompts={json.dumps(prompts)}"] if prompts else [],
        }
        sets = [*(set_ or []), *(item for items in given.values() for item in items)]
        cfg = load_config(preset or DEFAULT_PRESET, config, sets)
        layers = config_layers(preset or DEFAULT_PRESET, config, sets)
        option_of = {item.split("=", 1)[0].strip(): option for option, items in given.items() for item in items}
        origin: dict[str, str] = {}
        for layer, values in layers:
            origin.update({k: option_of.get(k, layer) if layer == "--set" else layer for k in values})
        for w in user_warnings(cfg, layers):  # what train would say, on stderr
            err.print(one_line(w), highlight=False, markup=False, soft_wrap=True)
    values = dotted(cfg.to_dict())
    if json_:
        print_json(
            {"config": cfg.to_dict(), **({"from": {k: origin.get(k, "default") for k in values}} if explain else {})}
        )
        return
    width = min(max(len(f"{k} = {toml(v)}") for k, v in values.items()), 48)  # the comments in one column
    for k, v in values.items():
        line = f"{k} = {toml(v)}"
        text = f"{line:<{width}}  # {origin.get(k, 'default')}" if explain else line
        out.print(text, markup=False, highlight=False, soft_wrap=True)


@config_app.command("reference")
def reference(
    json_: Annotated[bool, typer.Option("--json", help="Print the keys as JSON rows.")] = False,
) -> None:
    """Print every config key with its type, default and what it does (docs/config.md is this page).

    Examples:

      treegrpo config reference > docs/config.md

      treegrpo config reference --json
    """
    from .config_doc import markdown
    from .config_doc import reference as rows

    if json_:
        print_json(rows())
        return
    out.print(markdown(), markup=False, highlight=False, soft_wrap=True, end="")


def dotted(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'tree': {'branch': 2}} -> {'tree.branch': 2}."""
    flat: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(dotted(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def toml(v: Any) -> str:
    """A value as --set and TOML files write it."""
    if v is None:
        return '"none"'
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()
