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
