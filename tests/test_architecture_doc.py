"""docs/architecture.md names code as it is: every path, dotted name and identifier it puts in backticks exists."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "treegrpo_cli"
ROOMS = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} | {p.stem for p in PACKAGE.glob("*.py")}
PATH = re.compile(r"[\w.-]+(/[\w.-]*)+|[\w-]+\.(py|toml|json)")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
IDENTIFIER = re.compile(r"_?[A-Za-z]\w*")


def defined_names() -> set[str]:
    """Every function, class and module- or class-level assignment in the package."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                body = node.body if isinstance(node, ast.ClassDef) else []
            elif isinstance(node, ast.Module):
                body = node.body
            else:
                continue
            for stmt in body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def resolves(dotted: str) -> bool:
    """treegrpo_cli.<dotted> is a module, or an attribute (chain) of the longest module prefix whose function or
    class is defined there (not imported from elsewhere: a name that moved is stale where the text puts it)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        module = "treegrpo_cli." + ".".join(parts[:n])
        if not (PACKAGE.joinpath(*parts[:n]).with_suffix(".py").is_file() or PACKAGE.joinpath(*parts[:n]).is_dir()):
            continue
        obj = importlib.import_module(module)
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        first = getattr(importlib.import_module(module), parts[n]) if n < len(parts) else None
        return not (inspect.isfunction(first) or inspect.isclass(first)) or first.__module__ == module
    return False


def missing_names(text: str) -> list[str]:
    """The backticked code names of `text` that do not exist: paths (from the repository or the package),
    dotted names rooted in one of the package's rooms, and identifiers with an underscore or a capital (defined
    somewhere in the package). Other spans (config keys, commands, model names, values) are not code."""
    known, missing = defined_names(), []
    for span in re.findall(r"`([^`\n]+)`", text):
        if PATH.fullmatch(span):
            if not ((ROOT / span).exists() or (PACKAGE / span).exists()):
                missing.append(span)
        elif DOTTED.fullmatch(span):
            if span.split(".")[0] in ROOMS and not resolves(span):
                missing.append(span)
        elif (
            IDENTIFIER.fullmatch(span) and re.search(r"[_A-Z]", span) and not (span in known or (ROOT / span).exists())
        ):
            missing.append(span)
    return missing


@pytest.mark.slow
def test_every_code_name_in_architecture_md_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert len(re.findall(r"`[^`\n]+`", text)) > 100  # the reader sees the spans
    assert not missing_names(text), missing_names(text)


@pytest.mark.slow
def test_a_stale_name_is_caught():
    """The check can fail: a function moved out of the loop, a file that is gone, a class nobody defines, a function
    named where it is only re-exported; config keys, commands and model names pass as prose."""
    text = (
        "`training.loop.plan_iteration` `training.steps.plan_iteration` `models/flops_models.py` `models/flops.py` "
        "`NoSuchAdapter` `DiffusersPolicy` `train.iterations` `treegrpo train` `tiny-shapes` "
        "`config.layers.load_config` `config.load_config`"
    )
    stale = ["training.loop.plan_iteration", "models/flops_models.py", "NoSuchAdapter", "config.load_config"]
    assert missing_names(text) == stale
