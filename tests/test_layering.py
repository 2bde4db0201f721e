"""Imports flow one way: cli -> loop/stages -> engine; models, rewards and store implement or serve it."""

import subprocess
import sys

ENGINE = ["advantages", "credit", "grpo", "protocols", "pruning", "rollout", "schedules", "sde", "tree"]


def _loaded_after(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print('\\n'.join(m for m in sys.modules if m.startswith('treegrpo_cli')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_engine_imports_nothing_above_it():
    loaded = _loaded_after(["treegrpo_cli.engine"] + [f"treegrpo_cli.engine.{m}" for m in ENGINE])
    above = {m for m in loaded if "." in m and m.split(".")[1] in ("models", "store", "world", "rewards", "cli", "loop", "stages")}
    assert not above, sorted(above)
    assert "treegrpo_cli.engine.rollout" in loaded


def test_the_store_imports_nothing_above_it():
    """Shards, trees and checkpoints serialise the engine's tensors; loading models is the callers' job."""
    loaded = _loaded_after([f"treegrpo_cli.store.{m}" for m in ("shards", "trees", "checkpoint")])
    above = {m for m in loaded if "." in m and m.split(".")[1] in
             ("models", "world", "rewards", "cli", "loop", "stages", "rundir", "evaluate", "export", "diversity")}
    assert not above, sorted(above)
    assert "treegrpo_cli.store.trees" in loaded


def test_no_module_imports_another_modules_private_names():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "treegrpo_cli"
    bad = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("treegrpo_cli")):
                bad += [f"{path.relative_to(root)}: {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad


def test_both_transition_kernels_satisfy_the_kernel_protocol():
    import torch

    from treegrpo_cli.engine.protocols import Kernel
    from treegrpo_cli.engine.sde import DDIMKernel, FlowSDE, SamplerConfig

    cfg = SamplerConfig(steps=4)
    ddim = DDIMKernel(cfg, torch.linspace(0.99, 0.01, 1000), torch.tensor([750, 500, 250, 0]), 1000, 0.999)
    assert isinstance(FlowSDE(cfg), Kernel) and isinstance(ddim, Kernel)
    assert not isinstance(object(), Kernel)


def test_the_cli_starts_without_torch():
    """`treegrpo --help` and every command's --help load no torch: commands import the library when they run."""
    loaded = _loaded_after(["treegrpo_cli.cli.app"])
    code = "import sys, treegrpo_cli.cli.app; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
    assert "treegrpo_cli.cli.train_cmd" in loaded and "treegrpo_cli.loop" not in loaded
