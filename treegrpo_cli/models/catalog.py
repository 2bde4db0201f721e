"""The diffusers adapters' cards: what each adapter class declares about itself (`card = AdapterCard(...)` in its
class body), and every table derived from them (models/hub.py's `KNOWN` and `PIPELINES`, models/registry.py's
`ADAPTERS`, the CLI's model help, docs/models.md's adapters table).

The cards are read from the adapter modules' parsed source (`ast`), not imported: an adapter module loads torch,
and the CLI's help and the config layer list the models without it. A card's arguments are therefore literals
(strings, numbers, tuples, lists, dicts); one that is not is a ValueError naming its file, line and field.
tests/test_models_catalog.py checks that each imported adapter's card equals the one read here.

A diffusers model is one adapter file in models/: its class or classes with their cards (what the CLI and the
config layer need before torch), `RELEASES` (each release's configs: models/releases.py, random weights and the
memory table) and `TINY_PIPELINES` (the tests' tiny pipelines, tests/tinypipes.py). Nothing here changes.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class AdapterCard:
    """One diffusers adapter's details, as its class declares them."""

    name: str  # the adapter's name: describe()["adapter"], the prompt cache's key, what a pipeline class maps to
    family: str  # the models it serves as the CLI's help names them ("FLUX.1")
    pipelines: tuple[str, ...]  # the diffusers pipeline classes it loads (model_index.json's `_class_name`)
    releases: dict[str, str] = field(default_factory=dict)  # --model name -> hub id of each release it serves
    # settings it layers over a method preset (preset < these < [for_model] < --config < --set)
    defaults: dict[str, object] = field(default_factory=dict)
    # sampler.grid it samples on: "preset" (the preset's shifted grid), "model" (the pipeline scheduler's own,
    # with its dynamic shift) or "flow-match-euler" (diffusers' FlowMatchEuler grid at the scheduler's shift)
    grid: str = "preset"
    # config key -> (scheduler_config.json keys, ..., default): the first key the model folder's scheduler sets,
    # else the default (an int default asks for a whole number)
    scheduler: dict[str, tuple[object, ...]] = field(default_factory=dict)
    # release name -> that release's settings beyond the adapter's (SD3.5 Large's card samples at guidance 3.5)
    release_defaults: dict[str, dict[str, object]] = field(default_factory=dict)
    video: bool = False  # its samples are clips [B, 3, F, H, W]
    # releases whose hub repository is gated: the hub serves their files only to a logged-in account (a token) that
    # accepted the release's terms on its page
    gated: tuple[str, ...] = ()
    # docs/models.md's table of adapters (bench/model_memory.py writes it): what the denoiser predicts, how it samples
    predicts: str = "velocity"
    sampling: str = ""


@dataclass(frozen=True)
class Entry:
    """Where an adapter lives: models/<module>.py, class <cls>."""

    module: str
    cls: str
    card: AdapterCard


def read_cards(folder: Path = FOLDER) -> dict[str, Entry]:
    """adapter name -> its Entry, from every `card = AdapterCard(...)` in a class body of folder/*.py (files in
    name order, classes in file order), read from the parsed source: nothing is imported (the CLI reads the cards
    at start-up, without torch). A card that is not literal, one outside a class body, or a name or a release
    declared twice is a programming error: ValueError naming the file and line."""
    out: dict[str, Entry] = {}
    served: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "AdapterCard(" not in text:  # the quick test: most files in models/ declare none
            continue
        for cls, call in _card_calls(ast.parse(text, str(path)), path.name):
            where = f"{path.name}:{call.lineno}"
            card = _literal_card(call, where)
            if card.name in out:
                raise ValueError(f"{where}: adapter {card.name!r} is declared twice")
            stray = sorted((set(card.gated) | set(card.release_defaults)) - set(card.releases))
            if stray:
                raise ValueError(f"{where}: {', '.join(stray)} gated or with release defaults, but not a release")
            for release in card.releases:
                if release in served:
                    raise ValueError(f"{where}: release {release!r} is served by {served[release]!r} already")
                served[release] = card.name
            out[card.name] = Entry(path.stem, cls, card)
    return out


def _card_calls(tree: ast.Module, file: str) -> list[tuple[str, ast.Call]]:
    """(class name, its `AdapterCard(...)` call) of each `card = AdapterCard(...)` statement, in file order; one
    outside a top-level class body is an error."""
    owners = {id(s): c.name for c in tree.body if isinstance(c, ast.ClassDef) for s in c.body}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["card"]):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "AdapterCard"):
            continue
        if id(node) not in owners:
            raise ValueError(f"{file}:{node.lineno}: an AdapterCard belongs in an adapter's class body")
        found.append((owners[id(node)], call))
    return sorted(found, key=lambda f: f[1].lineno)


def _literal_card(call: ast.Call, where: str) -> AdapterCard:
    if call.args or any(k.arg is None for k in call.keywords):
        raise ValueError(f"{where}: AdapterCard takes keyword arguments only")
    values: dict[str, object] = {}
    for k in call.keywords:
        try:
            values[str(k.arg)] = ast.literal_eval(k.value)
        except (ValueError, TypeError, SyntaxError):
            raise ValueError(
                f"{where}: AdapterCard's {k.arg} must be a literal (strings, numbers, tuples, lists, dicts), "
                f"not `{ast.unparse(k.value)}`: the CLI reads cards without importing their module"
            ) from None
    try:
        return AdapterCard(**values)  # type: ignore[arg-type]
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


@cache
def entries() -> dict[str, Entry]:
    """The package's adapters, read once per process."""
    return read_cards()


def adapter_class(name: str) -> Any:
    """The adapter class of an adapter name, imported (its module loads torch)."""
    entry = entries()[name]
    return getattr(importlib.import_module(f".{entry.module}", __package__), entry.cls)


def known() -> dict[str, tuple[str, str]]:
    """Release name -> (hub id, adapter name), over every adapter's releases."""
    return {r: (hub_id, e.card.name) for e in entries().values() for r, hub_id in e.card.releases.items()}


def gated() -> set[str]:
    """Hub ids of the gated releases (their cards' `gated`)."""
    return {e.card.releases[r] for e in entries().values() for r in e.card.gated}


def pipelines() -> dict[str, str]:
    """Diffusers pipeline class -> adapter name."""
    return {p: e.card.name for e in entries().values() for p in e.card.pipelines}


def release_defaults() -> dict[str, dict[str, object]]:
    """Hub id -> the settings one release adds over its adapter's."""
    return {
        e.card.releases[r]: dict(values) for e in entries().values() for r, values in e.card.release_defaults.items()
    }


def families() -> list[str]:
    """The model families the adapters serve, each once, in adapter order ("FLUX.1", "FLUX.2", ...)."""
    return list(dict.fromkeys(e.card.family for e in entries().values()))
