"""README's performance table, generated from bench/results/methods.json (never typed by hand).

    python bench/readme_table.py            # rewrite the table between README's markers
    python bench/readme_table.py --check    # exit 1 when README's table is not the results file's

The papers' columns are their published figures for FLUX at 20 (BranchGRPO's table) or 25 (MixGRPO's)
steps and SD3.5-M at 10 steps (TreeGRPO), as collected in the reference notes (methods.md): forward
model evaluations per sample of the sampling policy and of the trained one, and seconds per iteration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from treegrpo_cli.report.compare_page import speedup_text

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- methods-table:begin -->", "<!-- methods-table:end -->"

# method: (NFE pi_old, NFE pi_theta, s/iter, source), the papers' own figures
PAPERS = {
    "dance-grpo": ("20", "20", "698", "BranchGRPO, FLUX, 20 steps"),
    "flow-grpo": ("10", "9", "-", "Flow-GRPO config, SD3.5-M (9 of 10 steps trained)"),
    "mix-grpo": ("20", "5", "289", "BranchGRPO, FLUX, window 5"),
    "branch": ("13.68", "13.68", "493", "BranchGRPO, FLUX"),
    "branch-widpru": ("13.68", "8.625", "314", "BranchGRPO, FLUX"),
    "branch-deppru": ("13.68", "8.625", "314", "BranchGRPO, FLUX"),
    "branch-mix": ("13.68", "4.25", "148", "BranchGRPO, FLUX"),
    "branch-mix-flow": ("-", "-", "-", "this study's variant of BranchGRPO-Mix: no paper figures"),
    "tree-grpo": ("7.5", "0.48", "72.0", "TreeGRPO, SD3.5-M, k=3 w=3 (NFE by our arithmetic)"),
    "treepo": ("-", "-", "-", "an LLM method: no image figures"),
    "nft": ("10", "9", "-", "DiffusionNFT config, SD3.5-M, 10 steps, 9 trained timesteps"),
    "tree-nft": ("-", "-", "-", "NFT on a tree's leaves, ours: no paper figures"),
}


def _pm(stat: dict, fmt: str) -> str:
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean']:{fmt}}" + (f" ± {stat['std']:{fmt.lstrip('+')}}" if stat["n"] > 1 else "")


def _speedup(g: dict) -> str:
    if g["speedup"] is None and g.get("curve_to_target", g.get("curve_minutes_to_target")) is not None:
        return "-"
    return speedup_text(g["speedup"], g.get("speedup_low"), g.get("speedup_high"), none="never reaches it")


def _minutes(g: dict) -> str:
    m = g.get("curve_to_target", g.get("curve_minutes_to_target"))
    return ("never" if m is None else f"{m:.2f}") + f" ({g['reached_target']}/{len(g['runs'])})"


def render(result: dict) -> str:
    """One row a method; where the results file holds `compare_raw` (since 2026-11-27), the trained weights' gain
    and speed-up beside the EMA's (the weights `eval` uses)."""
    cmp = result["compare"]
    raw = {g["label"]: g for g in result.get("compare_raw", {}).get("groups", [])}
    raw_head = "| held-out gain, trained weights | speed-up, trained weights " if raw else ""
    head = (
        "| method | forward NFE / sample (paper) | backward NFE / sample (paper) | s / iteration (paper, GPU) "
        "| iterations | held-out gain | minutes to target, mean curve (seeds reaching it) "
        "| speed-up vs dance-grpo (95% interval) " + raw_head + "| peak MiB |\n"
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if raw else "") + "---|\n"
    )
    rows = []
    for g in cmp["groups"]:
        old, new, sec, _ = PAPERS.get(g["label"], ("-", "-", "-", ""))
        r = raw.get(g["label"])
        raw_cells = f"| {_pm(r['gain'], '+.3f')} | {_speedup(r)} " if r else ""
        rows.append(
            f"| `{g['label']}` | {_pm(g['forward_nfe_per_sample'], '.2f')} ({old}) "
            f"| {_pm(g['backward_nfe_per_sample'], '.2f')} ({new}) "
            f"| {_pm(g['seconds_per_iteration'], '.2f')} ({sec}) "
            f"| {_pm(g['iterations'], '.0f')} | {_pm(g['gain'], '+.3f')} "
            f"| {_minutes(g)} | {_speedup(g)} " + raw_cells + f"| {_pm(g['peak_mib'], '.0f')} |"
        )
    m = result["machine"]
    target = f"{cmp['target']:+.3f}" + (f" (trained weights: {result['compare_raw']['target']:+.3f})" if raw else "")
    foot = (
        f"\n{len(result['runs'])} runs: {result['minutes_per_run']:g} minutes of training each, seeds "
        f"{', '.join(map(str, result['seeds']))}, one thread per run on {m['cpu'] or m['machine']} "
        f"({m['cores']} cores), torch {m['torch']}, reported at commit {result['commit']}; "
        f"target: dance-grpo's mean held-out gain {target}; "
        f"time to target: from when the mean held-out curve over seeds stays at or above it; "
        f"speed-up: dance-grpo's time over the method's (in brackets: 95% interval with both methods' seeds drawn "
        f"again with replacement, the target with them; never: draws that do not reach it). "
        f"Mean ± std over seeds. `{result['command'].strip()}`\n"
    )
    return head + "\n".join(rows) + "\n" + foot


def splice(readme: str, table: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table + readme[stop:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "bench/results/methods.json")
    ap.add_argument("--check", action="store_true", help="exit 1 if README's table differs from the results file")
    args = ap.parse_args()
    readme = (ROOT / "README.md").read_text()
    new = splice(readme, render(json.loads(args.results.read_text())))
    if args.check:
        sys.exit(0 if new == readme else 1)
    (ROOT / "README.md").write_text(new)


if __name__ == "__main__":
    main()
