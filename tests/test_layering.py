"""Imports flow one way: cli -> diversity -> report -> training -> config, models, rewards, store -> engine."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = ["advantages", "credit", "grpo", "protocols", "pruning", "rollout", "schedules", "sde", "tree"]


def _loaded_after(modules: list[str]) -> set[str]:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print('\\n'.join(m for m in sys.modules if m.startswith('treegrpo_cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


@pytest.mark.slow
def test_the_engine_imports_nothing_above_it():
    loaded = _loaded_after(["treegrpo_cli.engine"] + [f"treegrpo_cli.engine.{m}" for m in ENGINE])
    above = {
        m
        for m in loaded
        if "." in m
        and m.split(".")[1] in ("models", "store", "world", "rewards", "cli", "training", "report", "diversity")
    }
    assert not above, sorted(above)
    assert "treegrpo_cli.engine.rollout" in loaded


@pytest.mark.slow
def test_the_store_imports_nothing_above_it():
    """Shards, trees and checkpoints serialise the engine's tensors; loading models is the callers' job."""
    loaded = _loaded_after([f"treegrpo_cli.store.{m}" for m in ("shards", "trees", "checkpoint")])
    above = {
        m
        for m in loaded
        if "." in m and m.split(".")[1] in ("models", "world", "rewards", "cli", "training", "report", "diversity")
    }
    assert not above, sorted(above)
    assert "treegrpo_cli.store.trees" in loaded


@pytest.mark.slow
def test_no_module_imports_another_modules_private_names():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "treegrpo_cli"
    bad = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("treegrpo_cli")):
                bad += [
                    f"{path.relative_to(root)}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not bad, bad


def test_both_transition_kernels_satisfy_the_kernel_protocol():
    import torch

    from treegrpo_cli.engine.protocols import Kernel
    from treegrpo_cli.engine.sde import DDIMKernel, FlowSDE, SamplerConfig

    cfg = SamplerConfig(steps=4)
    ddim = DDIMKernel(cfg, torch.linspace(0.99, 0.01, 1000), torch.tensor([750, 500, 250, 0]), 1000, 0.999)
    assert isinstance(FlowSDE(cfg), Kernel) and isinstance(ddim, Kernel)
    assert not isinstance(object(), Kernel)


@pytest.mark.slow
def test_the_cli_starts_without_torch():
    """`treegrpo --help` and every command's --help load no torch: commands import the library when they run."""
    loaded = _loaded_after(["treegrpo_cli.cli.app"])
    code = "import sys, treegrpo_cli.cli.app; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    assert "treegrpo_cli.cli.train_cmd" in loaded and "treegrpo_cli.training.loop" not in loaded


PACKAGE = Path(__file__).resolve().parents[1] / "treegrpo_cli"


def _room(module: str) -> str:
    """`treegrpo_cli.training.loop` -> `training`; a loose module is a room of its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def room_imports(root: Path) -> dict[tuple[str, str], list[str]]:
    """(importer room, imported room) -> the files that make that arrow, from every import statement,
    those inside functions included. Reads the source; imports nothing."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        here = _room(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}" for a in node.names] if node.module is None else [stem]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                there = _room(t) if t.startswith(root.name + ".") else None
                if there and there != here and there != "__version__":
                    arrows.setdefault((here, there), []).append(str(path.relative_to(root)))
    return arrows


def two_way_pairs(arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    return [
        f"{a} <-> {b}: {arrows[a, b][0]} and {arrows[b, a][0]}" for a, b in sorted(arrows) if a < b and (b, a) in arrows
    ]


def cycles(arrows: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """Every room that lies on a cycle of the room graph, as the path found from it."""
    out_of: dict[str, set[str]] = {}
    for a, b in arrows:
        out_of.setdefault(a, set()).add(b)
    found = []
    for start in sorted(out_of):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(out_of.get(node, ())):
                if nxt == start:
                    found.append(path + [start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


@pytest.mark.slow
def test_for_every_pair_of_rooms_at_most_one_imports_the_other():
    arrows = room_imports(PACKAGE)
    assert ("cli", "training") in arrows and ("training", "engine") in arrows  # the reader sees the imports
    assert not two_way_pairs(arrows), two_way_pairs(arrows)
    assert not cycles(arrows), cycles(arrows)


@pytest.mark.slow
def test_a_planted_upward_import_is_caught(tmp_path):
    """The check above can fail: the same package with one upward import added (the engine reaching into training,
    or the world into report, which reaches the world through rewards) is refused."""
    copy = tmp_path / "treegrpo_cli"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    grpo = copy / "engine" / "grpo.py"
    grpo.write_text(
        grpo.read_text() + "\n\ndef _planted():\n    from ..training.loop import Trainer\n    return Trainer\n"
    )
    pairs = two_way_pairs(room_imports(copy))
    assert any(p.startswith("engine <-> training: engine/grpo.py") for p in pairs), pairs
    shutil.copy(PACKAGE / "engine" / "grpo.py", grpo)
    detect = copy / "world" / "detect.py"
    detect.write_text(detect.read_text() + "\nfrom ..report import compare  # noqa\n")
    assert not two_way_pairs(room_imports(copy)) and any("world" in c for c in cycles(room_imports(copy)))


def test_every_package_has_a_one_line_face_and_the_top_level_few_loose_modules():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, init
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= 6, loose


def test_the_cli_needs_no_click_of_its_own():
    """typer vendors click; a fresh `pip install -e .` has no `click` package, so the CLI must not import one."""
    code = "import sys; sys.modules['click'] = None; import treegrpo_cli.cli.app, treegrpo_cli.cli.common"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def file_imports(package: Path) -> dict[tuple[str, str], list[str]]:
    """(importing file, imported file) -> [the importing file] for the modules of one sub-package, from every import
    statement (inside functions and under TYPE_CHECKING included): `from .x import y`, `from . import x` and the
    absolute `treegrpo_cli.<package>.x` forms. Reads the source; imports nothing."""
    here = {p.stem for p in package.glob("*.py")}
    dotted = f"{package.parent.name}.{package.name}."
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(dotted):
                names = [(node.module or "")[len(dotted) :].split(".")[0]]
            elif isinstance(node, ast.Import):
                names = [a.name[len(dotted) :].split(".")[0] for a in node.names if a.name.startswith(dotted)]
            else:
                continue
            for name in names:
                if name in here and name not in (path.stem, "__init__"):
                    arrows.setdefault((path.stem, name), []).append(path.name)
    return arrows


def test_no_import_cycle_between_the_files_of_models():
    """models/ is a tree of files: the adapters import the diffusers base, the FLOP ledger and the catalog, which
    import none of them back (each adapter's FLOP formula lives in its own file)."""
    arrows = file_imports(PACKAGE / "models")
    assert ("flux", "diffusers_base") in arrows and ("flux", "flops") in arrows  # the reader sees the imports
    assert not cycles(arrows), cycles(arrows)


@pytest.mark.parametrize("room", ["engine", "report"])
def test_no_import_cycle_between_the_files_of_engine_and_report(room):
    """A type one file's hints need lives where no import back is needed: engine.protocols holds the StepResult its
    Kernel protocol returns (sde.py imports it), report.compare_groups the RunStats it groups (compare.py imports
    it); an import under TYPE_CHECKING counts."""
    arrows = file_imports(PACKAGE / room)
    assert ("sde", "protocols") in arrows if room == "engine" else ("compare", "compare_groups") in arrows
    assert not cycles(arrows), cycles(arrows)


def test_a_planted_cycle_between_model_files_is_caught(tmp_path):
    """The check above can fail: flops.py importing an adapter inside a function (as its formulas once did) closes
    a cycle flops -> flux -> flops."""
    models = tmp_path / "treegrpo_cli" / "models"
    shutil.copytree(PACKAGE / "models", models, ignore=shutil.ignore_patterns("__pycache__"))
    flops = models / "flops.py"
    flops.write_text(
        flops.read_text() + "\n\ndef _planted():\n    from .flux import FLUX_LORA\n\n    return FLUX_LORA\n"
    )
    assert any(c[0] == "flops" and "flux" in c for c in cycles(file_imports(models))), cycles(file_imports(models))
