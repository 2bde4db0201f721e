"""Reward plugins: rewards from outside treegrpo, named like built-in ones (docs/rewards.md, "Your own reward").

    mybright                 an entry point of the group `treegrpo.rewards` of an installed distribution
    path/to/file.py:fn       a function (or reward class) of a Python file, imported from its path
    package.module:fn        a function (or reward class) of an importable module

A plugin object is a reward class (as the built-ins are: the constructor takes the options as keyword arguments,
the instance is called with (images, prompts)) or a plain function `fn(images, prompts, **options)`; a parameter
named `device` or `dtype` receives the reward device and dtype. Entry points are listed once per process without
importing anything; a plugin's code is imported when its name is used. Every call's scores are checked (one
finite number per image), and every failure is one line that names the plugin.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import numbers
import sys
from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, TreegrpoError, shown
from .base import RewardSpec

GROUP = "treegrpo.rewards"
INJECTED = ("device", "dtype")  # parameters filled with the reward device and dtype, not options
RECORD = "reward_files"  # run.json: {name: {"path", "sha256"}} of the run's file rewards


@cache
def entry_points() -> dict[str, EntryPoint]:
    """{name: entry point} of the group treegrpo.rewards, nothing imported (a name holding ':', ',' or '/' is left
    out: it would read as a reference or a list)."""
    from importlib.metadata import entry_points as listed

    found: dict[str, EntryPoint] = {}
    for ep in listed(group=GROUP):
        if ep.name and not {":", ",", "/"} & set(ep.name):
            found.setdefault(ep.name, ep)  # the first on sys.path, as imports go
    return found


def is_reference(name: str) -> bool:
    """FILE.py:FN or MODULE:FN (an http:// address is the remote reward)."""
    return ":" in name and not name.startswith(("http://", "https://"))


def _is_file(where: str) -> bool:
    """The part before the ':' of a reference names a file (else a module)."""
    return where.endswith(".py") or "/" in where or "\\" in where


def described(name: str) -> str:
    """How an error line names a plugin: its reward name, and an entry point's target."""
    ep = entry_points().get(name) if not is_reference(name) else None
    return f"reward {shown(name)}" + (f" (entry point {ep.value} of {_dist(ep)})" if ep else "")


def clash(name: str) -> str | None:
    """The one line refusing a built-in name that an installed plugin declares too (which one would run?)."""
    ep = entry_points().get(name)
    if ep is None:
        return None
    return (
        f"reward {shown(name)} is built in, and the installed plugin {_dist(ep)} declares it too "
        f"(entry point {name} = {ep.value}): use that plugin as --reward {ep.value}, or rename its entry point"
    )


def plugin_spec(name: str) -> RewardSpec | None:
    """The spec of a reference or an entry point's name (its code imported now); None: neither."""
    if is_reference(name):
        where, _, attr = name.rpartition(":")
        if _is_file(where):
            path = _file(name, where)
            return _spec(name, _attribute(name, _import_file(name, where, path), attr, where), sha256(path))
        if not all(p.isidentifier() for p in [*where.split("."), *attr.split(".")]):
            raise ConfigError(f"reward {shown(name)} is neither a reward name nor FILE.py:FUNCTION nor MODULE:FUNCTION")
        return _spec(name, _attribute(name, _import(name, where), attr, where), "")
    ep = entry_points().get(name)
    if ep is None:
        return None
    return _spec(name, _guarded(name, "cannot be loaded", ep.load), "")


def file_record(names: list[str] | tuple[str, ...]) -> dict[str, dict[str, str]]:
    """{name: {"path": absolute path, "sha256": content hash}} of the file rewards among names (run.json)."""
    out = {}
    for name in names:
        where = name.rpartition(":")[0]
        if is_reference(name) and _is_file(where):
            path = _file(name, where)
            out[name] = {"path": str(path.resolve()), "sha256": sha256(path)}
    return out


def check_file_record(record: Any, names: list[str] | tuple[str, ...], where: str) -> None:
    """At resume: every file reward of the run is the file it started with (run.json's record)."""
    if not isinstance(record, dict) or not all(
        isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("sha256"), str)
        for r in record.values()
    ):
        raise TreegrpoError(f"{where}: {RECORD} must map reward names to a path and a sha256, got {shown(record)}")
    now = file_record([n for n in names if n in record])
    for name, then in record.items():
        if name in now and now[name]["sha256"] != then["sha256"]:
            path = now[name]["path"]
            which = "changed since the run started" if path == then["path"] else f"is not {then['path']}"
            raise TreegrpoError(
                f"reward {shown(name)}: {path} {which} (sha256 {then['sha256'][:12]}... then, "
                f"{now[name]['sha256'][:12]}... now); restore the run's file or start a new run"
            )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- loading ---------------------------------------------------------------------------------


def _dist(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an installed distribution"


def _one_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _guarded(name: str, what: str, call: Callable[[], Any]) -> Any:
    """call(); any exception of the plugin's code becomes one line naming the plugin."""
    try:
        return call()
    except TreegrpoError:
        raise
    except (Exception, SystemExit) as e:
        raise TreegrpoError(f"{described(name)} {what}: {_one_line(e)}") from None


def _file(name: str, where: str) -> Path:
    path = Path(where).expanduser()
    if not path.is_file():
        raise ConfigError(f"reward {shown(name)}: no file {where} (looked in {Path.cwd()})")
    return path


def _import_file(name: str, where: str, path: Path) -> Any:
    """The module of a file, by content: a changed file is imported anew (the same one once)."""
    module_name = f"treegrpo_reward_plugin_{sha256(path)[:16]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    found = importlib.util.spec_from_file_location(module_name, path.resolve())
    if found is None or found.loader is None:
        raise ConfigError(f"reward {shown(name)}: {where} is not a Python file")
    module = importlib.util.module_from_spec(found)
    sys.modules[module_name] = module
    try:
        _guarded(name, f"fails to import {where}", lambda: found.loader.exec_module(module))  # type: ignore[union-attr]
    except TreegrpoError:
        del sys.modules[module_name]
        raise
    return module


def _import(name: str, module: str) -> Any:
    return _guarded(name, f"cannot import {module}", lambda: importlib.import_module(module))


def _attribute(name: str, module: Any, attr: str, where: str) -> Any:
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"reward {shown(name)}: {where} has no {attr}")
        obj = getattr(obj, part)
    return obj


def _spec(name: str, obj: Any, version: str) -> RewardSpec:
    """A reward class or function as a registry entry: its options are its named parameters (past images and
    prompts for a function), besides device and dtype."""
    if not callable(obj):
        raise ConfigError(f"reward {shown(name)} is a {type(obj).__name__}, not a function or a reward class")
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        params = []
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not inspect.isclass(obj):
        positional = [p for p in named if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params):
            raise ConfigError(f"reward {shown(name)} must take (images, prompts); it takes {len(positional)} arguments")
        named = named[2:]
    injected = {p.name for p in named if p.name in INJECTED}
    options = tuple(p.name for p in named if p.name not in INJECTED)

    def factory(device: torch.device | None = None, dtype: torch.dtype | None = None, **opts: str) -> Checked:
        given = {k: v for k, v in (("device", device), ("dtype", dtype)) if k in injected}
        if inspect.isclass(obj):
            made = _guarded(name, "failed to start", lambda: obj(**given, **opts))
            return Checked(name, made, {})
        return Checked(name, obj, {**given, **opts})

    summary = f"plugin {getattr(obj, '__qualname__', type(obj).__name__)}" + (f" ({version[:12]})" if version else "")
    return RewardSpec(name, factory, options, on_device=True, summary=summary)


class Checked:
    """A plugin reward whose every call is checked: one finite number per image, errors in one line."""

    def __init__(self, name: str, fn: Callable[..., Any], kwargs: dict[str, Any]):
        if not callable(fn):
            raise TreegrpoError(f"{described(name)} built a {type(fn).__name__}, which cannot be called")
        self.name, self.fn, self.kwargs = name, fn, kwargs
        self.video = bool(getattr(fn, "video", False))

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        out = _guarded(self.name, "failed", lambda: self.fn(images, prompts, **self.kwargs))
        return scores_of(self.name, out, len(images))


def scores_of(name: str, out: Any, n: int) -> Tensor:
    """[n] float32: a plugin's output (a tensor, an array, a list or tuple of numbers), or one line naming it."""
    said = described(name)
    if isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            if not _is_number(v):
                raise TreegrpoError(f"{said} returned a non-number for image {i}: {shown(v, 60)}")
        out = torch.tensor([float(v) for v in out], dtype=torch.float64)
    elif isinstance(out, np.ndarray):
        if out.dtype.kind not in "biuf":
            raise TreegrpoError(f"{said} returned an array of {out.dtype}, not of numbers")
        out = torch.from_numpy(np.ascontiguousarray(out))
    if not isinstance(out, Tensor):
        raise TreegrpoError(f"{said} returned a {type(out).__name__}; a reward returns one number per image")
    if out.is_complex():
        raise TreegrpoError(f"{said} returned complex numbers; a reward returns one real number per image")
    if out.dim() > 2 or out.numel() != n or (out.dim() == 2 and out.shape[1] != 1):
        got = f"{out.numel()} scores" if out.dim() <= 1 else f"scores of shape {list(out.shape)}"
        raise TreegrpoError(f"{said} returned {got} for {n} images; a reward returns one number per image")
    scores = out.detach().reshape(-1).float()
    bad = (~torch.isfinite(scores)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise TreegrpoError(f"{said} returned {float(scores[i])} for image {i}; scores must be finite numbers")
    return scores


def _is_number(v: Any) -> bool:
    """A real number: a Python or numpy number, or a one-element tensor or array of numbers."""
    if isinstance(v, Tensor):
        return v.numel() == 1 and not v.is_complex()
    if isinstance(v, np.ndarray):
        return v.size == 1 and v.dtype.kind in "biuf"
    return isinstance(v, numbers.Real)
