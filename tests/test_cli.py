import json
import re

import pytest
from clitools import one_line_error, run

PIXEL = ("--model", "pixel")  # engine checks on the small random pixel network (jpeg rewards)


@pytest.fixture(scope="module")
def branch_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("trees") / "branch"
    r = run("rollout", *PIXEL, "--preset", "branch", "-n", 2, "--seed", 5, "--out", out)
    assert r.exit_code == 0, r.output
    r = run("score", out, "--reward", "jpeg-compressibility")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow
def test_dense_branch_inspect_json(branch_dir):
    r = run("inspect", branch_dir, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    meta = data["meta"]
    assert meta["evals_per_tree"] == 203 and meta["nfe"] == 2 * 203 and meta["num_trees"] == 2
    assert meta["scoring"]["advantage"]["estimator"] == "branch"
    assert {"ddof", "beta", "clamp", "weighting"} <= set(meta["scoring"]["advantage"])
    tree = data["trees"][0]
    nodes = tree["nodes"]
    assert tree["prompt"] and len(nodes) == 219
    assert set(nodes[0]) == {"id", "parent", "depth", "sigma", "sde", "log_prob", "reward", "advantage", "trained"}
    root = nodes[0]
    assert root["parent"] is None and root["depth"] == 0 and root["log_prob"] is None and root["advantage"] is None
    leaves = [n for n in nodes if n["depth"] == 20]
    assert len(leaves) == 16 and all(n["reward"] is not None for n in leaves)
    assert all(n["reward"] is None for n in nodes if n["depth"] < 20)
    # decoded from x0, yet the released code (the preset's pruning.train_last) trains the last edge too
    assert all(n["trained"] == (abs(n["advantage"]) > 1e-6) for n in leaves)
    assert all(n["advantage"] is not None and n["log_prob"] is not None for n in nodes[1:])
    # two prompts' groups of 16 leaves: none ties (JPEG sizes differ), the spread is each group's population std
    groups = [[n["reward"] for n in t["nodes"] if n["depth"] == 20] for t in data["trees"]]
    spread = [(sum((r - sum(g) / len(g)) ** 2 for r in g) / len(g)) ** 0.5 for g in groups]
    assert data["groups"]["zero_std_ratio"] == 0.0
    assert data["groups"]["reward_group_std"] == pytest.approx(sum(spread) / 2, rel=1e-5)


@pytest.mark.slow
def test_inspect_ids_are_dense_per_tree(branch_dir):
    data = json.loads(run("inspect", branch_dir, "--json").stdout)
    for tree in data["trees"]:
        ids = [n["id"] for n in tree["nodes"]]
        assert ids == list(range(219))
        assert all(n["parent"] is None or n["parent"] < n["id"] for n in tree["nodes"])


@pytest.mark.slow
def test_overwrite_removes_old_shards(tmp_path):
    out = tmp_path / "t"
    args = ("rollout", *PIXEL, "--preset", "flow-grpo", "--set", "tree.trees_per_prompt=2", "--out", out)
    assert run(*args, "-n", 3, "--prompts-per-shard", 1).exit_code == 0
    assert len(list(out.glob("trees-*.safetensors"))) == 3
    assert run(*args, "-n", 1, "--overwrite").exit_code == 0
    assert [p.name for p in out.glob("*.safetensors")] == ["trees-00000.safetensors"]


def test_inspect_table(branch_dir):
    r = run("inspect", branch_dir)
    assert r.exit_code == 0 and "203.0 per tree" in r.stdout and "jpeg-compressibility" in r.stdout
    assert "0% with tied rewards" in r.stdout


@pytest.mark.slow
def test_treegrpo_preset_counts(tmp_path):
    r = run("rollout", *PIXEL, "--preset", "tree-grpo", "-n", 1, "--out", tmp_path / "t", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["nfe"] == 202 and summary["leaves_per_tree"] == 27
    assert run("score", tmp_path / "t").exit_code == 0
    nodes = json.loads(run("inspect", tmp_path / "t", "--json").stdout)["trees"][0]["nodes"]
    assert sum(n["trained"] for n in nodes) == 3 + 9 + 27  # the window's edges
    assert all(n["log_prob"] is None for n in nodes if not n["sde"])


@pytest.mark.slow
def test_same_seed_same_shards(tmp_path, branch_dir):
    out = tmp_path / "again"
    assert run("rollout", *PIXEL, "--preset", "branch", "-n", 2, "--seed", 5, "--out", out).exit_code == 0
    a = json.loads((branch_dir / "index.json").read_text())["shards"]["trees-00000"]["sha256"]
    b = json.loads((out / "index.json").read_text())["shards"]["trees-00000"]["sha256"]
    assert a == b


def test_save_images_and_jsonl_prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a red circle"}\n\n{"prompt": "a blue square"}\n')
    out = tmp_path / "imgs"
    r = run(
        "rollout",
        *PIXEL,
        "--preset",
        "dance-grpo",
        "--prompts",
        p,
        "-n",
        2,
        "--out",
        out,
        "--save-images",
        "--set",
        "tree.branch=3",
        "--set",
        "sampler.steps=4",
    )
    assert r.exit_code == 0, r.output
    assert len(list((out / "images").glob("p0[01]-a-*-leaf0[0-2].png"))) == 6


@pytest.mark.slow
def test_flipped_byte_fails_score_and_inspect(tmp_path):
    out = tmp_path / "t"
    assert (
        run(
            "rollout", *PIXEL, "--preset", "flow-grpo", "-n", 1, "--set", "tree.trees_per_prompt=2", "--out", out
        ).exit_code
        == 0
    )
    f = out / "trees-00000.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    one_line_error(run("score", out), "trees-00000.safetensors", "corrupt")
    one_line_error(run("inspect", out), "trees-00000.safetensors", "corrupt")


@pytest.mark.slow
def test_bad_inputs_are_one_line(tmp_path):
    one_line_error(run("rollout", *PIXEL, "--out", tmp_path / "a", "--prompts", tmp_path / "none.txt"), "not found")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    one_line_error(run("rollout", *PIXEL, "--out", tmp_path / "b", "--prompts", empty), "no prompts")
    one_line_error(run("rollout", *PIXEL, "--out", tmp_path / "c", "--preset", "brnch"), "unknown preset", "branch")
    one_line_error(run("rollout", *PIXEL, "--out", tmp_path / "d", "--set", "tree.brnch=2"), "tree.branch")
    one_line_error(run("score", tmp_path), "not a folder written by treegrpo")
    one_line_error(run("inspect", tmp_path / "missing"), "no such folder")


@pytest.mark.slow
def test_unknown_reward_and_refuse_overwrite(tmp_path):
    out = tmp_path / "t"
    assert (
        run(
            "rollout", *PIXEL, "--preset", "flow-grpo", "-n", 1, "--set", "tree.trees_per_prompt=2", "--out", out
        ).exit_code
        == 0
    )
    one_line_error(run("score", out, "--reward", "hps-v9"), "unknown reward")
    one_line_error(run("rollout", *PIXEL, "--preset", "flow-grpo", "-n", 1, "--out", out), "already")
    r = run(
        "score",
        out,
        "--reward",
        "jpeg-compressibility,jpeg-incompressibility",
        "--weights",
        "1,0.5",
        "--combine",
        "advantages",
        "--estimator",
        "flat",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["estimator"] == "flat"


def test_presets_json():
    r = run("presets", "--json")
    assert r.exit_code == 0
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert rows["branch"]["evals_per_prompt"] == 203 and rows["tree-grpo"]["leaves_per_prompt"] == 27
    assert rows["flow-grpo"]["evals_per_prompt"] == 24 * 10 and rows["flow-grpo"]["trees_per_prompt"] == 24
    # tree-nft: 1 + 3 x 3 (steps 1-3) + 9 x 3 (steps 4-6) + 27 x 3 (steps 7-9) = 118 evaluations for 27 samples
    assert rows["tree-nft"]["evals_per_prompt"] == 118 and rows["tree-nft"]["leaves_per_prompt"] == 27
    assert rows["nft"]["objective"] == "nft" and rows["flow-grpo"]["objective"] == "grpo"


def test_readme_preset_table_agrees_with_presets():
    """A row for every preset, with its leaves and model evaluations ("at most N" for a dynamic tree: its cap)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = {
        m.group(1): (int(m.group(2)), int(m.group(3)))
        for m in re.finditer(r"^\| `([a-z-]+)` \|[^|]*\| (\d+) \| (?:at most )?(\d+) \|", readme, re.M)
    }
    rows = {
        p["name"]: (p["leaves_per_prompt"], p["evals_per_prompt"]) for p in json.loads(run("presets", "--json").stdout)
    }
    assert table == rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    ["", "rollout", "score", "train", "eval", "diversity", "export", "inspect", "presets", "compare", "serve-reward"],
)
def test_help_reads_naturally_at_80_columns(command):
    """No Python type placeholders (<bool>, <list[str]>, <str>) in any command's --help, and its description wraps
    at the terminal's width, not at the source's line breaks (no line ends where the next one's first word fits)."""
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "treegrpo_cli", *([command] if command else []), "--help"]
    text = subprocess.run(args, capture_output=True, text=True, check=True, env=dict(os.environ, COLUMNS="80")).stdout
    assert "Usage: " in text
    assert not re.search(r"<(bool|str|int|float|path|list\[[^\]]*\])[^>]*>", text), text
    assert max(len(line) for line in text.splitlines()) <= 80
    description = [line.strip() for line in text.split("╭")[0].splitlines()[2:]]
    for a, b in zip(description, description[1:], strict=False):
        assert not (a and b and len(a) + 1 + len(b.split()[0]) <= 78), f"ragged: {a!r} / {b!r}"


def test_inspect_table_shows_rewards_and_advantages_per_depth(branch_dir):
    r = run("inspect", branch_dir)
    assert r.exit_code == 0, r.output
    assert "reward" in r.stdout and "advantage" in r.stdout
    data = json.loads(run("inspect", branch_dir, "--json").stdout)
    leaves = [n for t in data["trees"] for n in t["nodes"] if n["reward"] is not None]
    from treegrpo_cli.report.tree_report import inspect_trees

    last = inspect_trees(branch_dir, with_nodes=False)["depths"][-1]
    mean = sum(n["reward"] for n in leaves) / len(leaves)
    assert abs(last["reward_mean"] - mean) < 1e-5 and f"{mean:+.3f}" in r.stdout


def test_an_iteration_line_says_its_ties_and_what_a_dynamic_rollout_did():
    from treegrpo_cli.cli.train_report import iteration_line

    row = {"iteration": 3, "reward_mean": 0.5, "reward_std": 0.25, "zero_std_ratio": 0.375, "seconds": {"total": 2.04}}
    assert iteration_line(row) == "iteration 3: reward 0.5000 ± 0.2500, 38% of groups tied, 2.0s"
    row |= {"early_stops": 5, "evals_saved": 100, "rollout_evals": 300, "replaced": 2}
    assert iteration_line(row) == (
        "iteration 3: reward 0.5000 ± 0.2500, 38% of groups tied, 5 early stops (25% of the forwards saved), "
        "2 tied prompts replaced, 2.0s"
    )
    staged = {"iteration": 0, "reward_mean": 0.5, "reward_std": 0.25, "seconds": {"total": 1.0}}  # no group stats
    assert iteration_line(staged) == "iteration 0: reward 0.5000 ± 0.2500, 1.0s"
