"""What a practitioner expects of any command-line tool: a version that says what runs, shell completion, one place
that lists the environment variables, and a rollout that says when it repeats prompts."""

import json
import re
from pathlib import Path

import pytest
import torch
from clitools import run

from treegrpo_cli import __version__
from treegrpo_cli.training import stages

ROOT = Path(__file__).resolve().parents[1]
PIXEL = ("--model", "pixel", "--preset", "dance-grpo", "--set", "tree.branch=3", "--set", "sampler.steps=4")


def test_version_names_the_commit_torch_cuda_and_device():
    r = run("--version")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"treegrpo {__version__}")
    if (ROOT / ".git").exists():
        assert re.search(r"\(commit [0-9a-f]{7,}\)$", lines[0]), lines[0]
    assert lines[1].startswith(f"torch {torch.__version__}, CUDA ")
    want = "none (a CPU build of torch)" if torch.version.cuda is None else torch.version.cuda
    assert want in lines[1]
    assert lines[2] == "--device auto: " + ("cuda:0" if torch.cuda.is_available() else "cpu")


@pytest.mark.slow
def test_shell_completion_prints_a_script():
    r = run("--show-completion", "bash")
    assert r.exit_code == 0, r.output
    assert "complete" in r.stdout and "_TREEGRPO_COMPLETE" in r.stdout
    assert "--install-completion" in run("--help").stdout


def read_names() -> set[str]:
    """Every environment variable the package reads: os.environ / getenv by name, and TREEGRPO_* names passed to
    the lookups that read them (reward weights, diversity features)."""
    names = set()
    patterns = (
        r"""(?:environ\.get|getenv)\(\s*["']([A-Z][A-Z0-9_]*)["']""",
        r"""environ\[\s*["']([A-Z][A-Z0-9_]*)["']""",
        r"""["']([A-Z][A-Z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ""",
        r"""["'](TREEGRPO_[A-Z0-9_]+)["']""",
    )
    for path in (ROOT / "treegrpo_cli").rglob("*.py"):
        text = path.read_text()
        for pattern in patterns:
            names |= set(re.findall(pattern, text))
    return names


def test_every_environment_variable_read_is_in_the_doc():
    names = read_names()
    assert {"TREEGRPO_DIST_TIMEOUT", "HF_HOME", "LOCAL_RANK", "WANDB_PROJECT", "TREEGRPO_HPS_CHECKPOINT"} <= names
    doc = (ROOT / "docs" / "environment.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/environment.md does not list {missing}"
    assert "docs/environment.md" in (ROOT / "README.md").read_text()


def test_leaf_image_names():
    assert stages.leaf_image_name(0, "a red fox", 3) == "p00-a-red-fox-leaf03.png"
    assert stages.leaf_image_name(7, "Ünïcode / ../ *?  x", 12, 3, 3) == "p007-ncode-x-leaf012.png"
    assert stages.leaf_image_name(1, "???", 0) == "p01-prompt-leaf00.png"
    long = stages.leaf_image_name(1, "word " * 100, 0)
    assert len(long) <= len("p01--leaf00.png") + stages.SLUG_CHARS and not long.startswith("p01--")


@pytest.mark.slow
def test_rollout_names_leaves_by_prompt_and_says_when_it_repeats_prompts(tmp_path):
    p = tmp_path / "two.jsonl"
    p.write_text('{"prompt": "a red circle"}\n{"prompt": "a blue square"}\n')
    r = run("rollout", *PIXEL, "--prompts", p, "-n", 2, "--out", tmp_path / "once", "--save-images")
    assert r.exit_code == 0, r.output
    assert "note:" not in r.stderr  # each prompt once
    assert sorted(q.name for q in (tmp_path / "once" / "images").iterdir()) == [
        *(f"p00-a-red-circle-leaf{k:02d}.png" for k in range(3)),
        *(f"p01-a-blue-square-leaf{k:02d}.png" for k in range(3)),
        "prompts.json",  # the map `eval --images` reads
    ]
    assert json.loads((tmp_path / "once" / "images" / "prompts.json").read_text())["p01-a-blue-square-leaf02.png"] == (
        "a blue square"
    )
    r = run("rollout", *PIXEL, "--prompts", p, "-n", 6, "--out", tmp_path / "thrice", "--save-images")
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: 6 trees of 2 distinct prompts: each is rolled out in up to 3 trees "
        "(6 prompts drawn from the 2 given cycle them)"
    ]
    names = sorted(q.name for q in (tmp_path / "thrice" / "images").iterdir() if q.suffix == ".png")
    assert len(names) == 18 and names[-1] == "p01-a-blue-square-leaf08.png"
