"""The diffusers adapters' cards: what each adapter class declares about itself (`card = AdapterCard(...)` in its
class body), and every table derived from them (models/hub.py's `KNOWN` and `PIPELINES`, models/registry.py's
`ADAPTERS`, the CLI's model help).

The cards are read from the adapter modules' source, not imported: an adapter module loads torch, and the CLI's
help and the config layer list the models without it. A card's arguments are therefore literals (strings,
numbers, tuples, dicts); tests/test_models_catalog.py checks that each imported adapter's card equals the one
read here. Adding a diffusers model is one adapter file in models/ with its card; nothing here changes.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

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


@dataclass(frozen=True)
class Entry:
    """Where an adapter lives: models/<module>.py, class <cls>."""

    module: str
    cls: str
    card: AdapterCard


CARD = re.compile(r"^[ \t]+card = AdapterCard\(", re.M)  # in a class body
CLASS = re.compile(r"^class (\w+)\b", re.M)


def read_cards(folder: Path = FOLDER) -> dict[str, Entry]:
    """adapter name -> its Entry, from every `card = AdapterCard(...)` in a class body of folder/*.py (files in
    name order). Only the card statements are parsed (the CLI reads them at start-up). A card that is not literal,
    or a name declared twice, is a programming error: ValueError."""
    out: dict[str, Entry] = {}
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in CARD.finditer(text):
            classes = CLASS.findall(text, 0, match.start())
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.name}:{line}"
            if not classes:
                raise ValueError(f"{where}: an AdapterCard belongs in an adapter's class body")
            card = _literal_card(_statement(text[match.start() :], where), where)
            if card.name in out:
                raise ValueError(f"{where}: adapter {card.name!r} is declared twice")
            out[card.name] = Entry(path.stem, classes[-1], card)
    return out


def _statement(text: str, where: str) -> ast.Call:
    """The `card = AdapterCard(...)` call that starts `text`: its lines up to the first that completes it."""
    lines = text.splitlines(keepends=True)
    for n in range(1, len(lines) + 1):
        try:
            node = ast.parse(textwrap.dedent("".join(lines[:n]))).body[0]
        except SyntaxError:
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            return node.value
        break
    raise ValueError(f"{where}: not a `card = AdapterCard(...)` statement")


def _literal_card(call: ast.Call, where: str) -> AdapterCard:
    if call.args or any(k.arg is None for k in call.keywords):
        raise ValueError(f"{where}: AdapterCard takes keyword arguments only")
    try:
        return AdapterCard(**{k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    except (ValueError, TypeError, SyntaxError) as e:
        raise ValueError(f"{where}: an AdapterCard's arguments must be literals ({e})") from None


@cache
def entries() -> dict[str, Entry]:
    """The package's adapters, read once per process."""
    return read_cards()


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
