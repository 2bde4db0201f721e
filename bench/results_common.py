"""What the results page's sections share: the results files read (and remembered), number formats, the held-out
plot redrawn from a results file's numbers, a run's command cleaned of its scratch folders."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import study_tables as tables

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


class Sources:
    """Reads the results files and remembers which were read (the test holds every file to a reader)."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def json(self, name: str) -> dict:
        self.read.add(name)
        data = (RESULTS / name).read_bytes()
        out = json.loads(gzip.decompress(data) if name.endswith(".gz") else data)
        for v in (out, *out.values()) if isinstance(out, dict) else ():  # comparisons saved before the bound
            if isinstance(v, dict) and {"groups", "runs", "baseline"} <= v.keys():
                tables.fill_bounds(v)
        return out

    def text(self, name: str) -> str:
        self.read.add(name)
        return (RESULTS / name).read_text()

    def names(self, pattern: str) -> list[str]:
        return sorted(p.name for p in RESULTS.glob(pattern))


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else f"{v:{spec}}"


def pm(stat: dict, spec: str) -> str:
    return tables._pm(stat, spec)


# --- plots ---------------------------------------------------------------------------------------


def comparison(d: dict) -> SimpleNamespace:
    """What compare_page.reward_plot reads of a Comparison, from the dict a results file keeps of it."""
    runs = [SimpleNamespace(label=r["label"], heldout_curve=[tuple(p) for p in r["heldout_curve"]]) for r in d["runs"]]
    groups = [SimpleNamespace(label=g["label"]) for g in d["groups"]]
    return SimpleNamespace(measure=d["measure"], groups=groups, runs=runs, target=d["target"], axis=d["axis"])


def plot(images: dict, name: str, cmp: dict, alt: str, labels: list[str] | None = None) -> str:
    """The held-out curves of a results file's comparison, of the groups `labels` names in its order (all, in the
    file's order, when None): a group's colour is its place, so a baseline listed first keeps its colour."""
    from treegrpo_cli.report.compare import Comparison
    from treegrpo_cli.report.compare_page import reward_plot

    cmp = cmp if labels is None else shown(cmp, labels)
    images[name] = reward_plot(cast(Comparison, comparison(cmp)))  # a namespace of what it reads
    return f"![{alt}](results/{name})\n"


def shown(cmp: dict, labels: list[str]) -> dict:
    """A saved comparison cut to the groups and runs `labels` names, its groups in the order of `labels`."""
    groups = sorted((g for g in cmp["groups"] if g["label"] in labels), key=lambda g: labels.index(g["label"]))
    return {**cmp, "groups": groups, "runs": [r for r in cmp["runs"] if r["label"] in labels]}


def command(cmd: str) -> str:
    """A run's command without its scratch folder and output flags."""
    words, out, skip = cmd.split(), [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--run-dir", "--out"):
            skip = True
        elif w != "--json" and not w.startswith("("):
            out.append(w)
    return " ".join(out)


def world_rl_table(src: Sources, names: list[str]) -> str:
    """`treegrpo train` runs, each evaluated at two seeds against the base model on the same prompts and noises."""
    head = (
        "| run | commit | minutes | run's own held-out | training reward, first -> last tenth "
        "| eval seed 5: base -> trained (gain) | eval seed 6 |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in names:
        r = src.json(name)
        for run in r["runs"]:
            sm = run["summary"]
            evals = {e["seed"]: e for e in run["evals"]}
            cells = [
                f"{evals[s]['baseline']:.3f} -> {evals[s]['trained']:.3f} ({evals[s]['gain']:+.3f})"
                if s in evals
                else "-"
                for s in (5, 6)
            ]
            lines.append(
                f"| `{command(run['command'])}` | {r['commit']} | {run['wall_minutes']:.1f} "
                f"| {sm['heldout_before']:.3f} -> {sm['heldout_after']:.3f} "
                f"| {sm['reward_first_tenth']:.3f} -> {sm['reward_last_tenth']:.3f} | {cells[0]} | {cells[1]} |"
            )
    return head + "\n".join(lines) + "\n"


def control_table(r: dict) -> str:
    """bench/shapes_rl_vs_pretrain.py: the RL run against the same minutes of continued pretraining."""
    return (
        f"| policy | held-out reward (n = {r['base']['n']}) | gain |\n|---|---|---|\n"
        f"| shipped weights | {r['base']['mean']:.4f} (SEM {r['base']['sem']:.3f}) | |\n"
        f"| `{command(r['rl_command'])}` ({r['rl_minutes']:.1f} min) | {r['rl']['mean']:.4f} "
        f"(SEM {r['rl']['sem']:.3f}) | {r['rl_gain']:+.3f} |\n"
        f"| the same minutes of continued pretraining ({r['control_minutes']:.1f} min, lr {r['control_lr']:g}) "
        f"| {r['control']['mean']:.4f} (SEM {r['control']['sem']:.3f}) | {r['control_gain']:+.3f} |\n"
    )
