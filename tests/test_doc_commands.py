"""The training commands README.md and docs/distributed.md print run as printed: each line taken from the docs'
text, with stand-ins appended for what this machine lacks (random tiny weights for the model, an offline reward for
one whose weights are absent, one short iteration), on 1 and 2 gloo processes for real; the prompt arithmetic of
the process counts they name (8, 32) through the same function the run uses."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from treegrpo_cli.config import load_config
from treegrpo_cli.training.dist import scaled_prompts

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "distributed.md"]
# what this machine lacks, appended to each printed line (a later --reward or --set wins)
SHORT = ["--iterations", "1", "--set", "train.eval_samples=0", "--set", "train.sample_every=0"]
RANDOM_WEIGHTS = ["--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']  # a released --model's
OFFLINE_REWARD = ["--reward", "jpeg-compressibility"]  # HPS and other model rewards need weights files


def doc_lines() -> list[tuple[str, int, list[str]]]:
    """(doc, processes, train's arguments) of every training command line the docs print with a process count or a
    released model."""
    found = []
    for doc in DOCS:
        text = doc.read_text().replace("\\\n", " ")
        for line in _code_lines(text):
            m = re.search(r"(torchrun .*-m treegrpo_cli train|treegrpo train)(.*)$", line.strip())
            if not m or ("--model" not in line and "--nproc-per-node" not in line):
                continue
            words = shlex.split(m.group(0).split("#")[0].replace("$HEAD", "head"))
            procs = _count(words, "--nproc-per-node") * _count(words, "--nnodes")
            args = words[words.index("train") + 1 :]
            if "--nproc-per-node" in args:  # treegrpo's own: taken out, set per run below
                i = args.index("--nproc-per-node")
                del args[i : i + 2]
            found.append((doc.name, procs, args))
    return found


def _code_lines(text: str) -> list[str]:
    """The lines of a markdown text's code: fenced blocks and lines indented by four spaces or more."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            lines.append(line)
    return lines


def _count(words: list[str], option: str) -> int:
    return int(words[words.index(option) + 1]) if option in words else 1


def test_the_docs_print_the_lines_this_file_checks():
    lines = doc_lines()
    counts = {(doc, n) for doc, n, _ in lines}
    assert {("README.md", 1), ("README.md", 8), ("distributed.md", 2), ("distributed.md", 8)} <= counts, counts
    assert ("distributed.md", 32) in counts  # 4 nodes x 8


@pytest.mark.parametrize("doc, procs, args", doc_lines(), ids=lambda x: str(x)[:60] if isinstance(x, list) else None)
def test_every_process_count_the_docs_name_gets_whole_prompt_shares(doc, procs, args):
    """The arithmetic of 8 and 32 processes: rollout.num_prompts scaled to a multiple, each a share >= 1."""
    sets = _sets_of(args)
    cfg = load_config(_option(args, "--preset"), None, sets)
    n = scaled_prompts(cfg.rollout.num_prompts, procs)
    assert n % procs == 0 and n >= procs and n - cfg.rollout.num_prompts < procs


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _sets_of(args: list[str]) -> list[str]:
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    if (model := _option(args, "--model")) is not None:
        sets.append(f'model="{model}"')
    return sets


@pytest.mark.parametrize("doc, procs, args", doc_lines(), ids=lambda x: str(x)[:60] if isinstance(x, list) else None)
def test_every_printed_line_passes_the_dry_run_on_its_own_process_count(doc, procs, args, tmp_path):
    """The line as printed (stand-ins appended) through `train --dry-run` on the processes it names: nothing
    loaded, nothing missing, the prompts an iteration a multiple of them, one or more each."""
    (tmp_path / "prompts.txt").write_text("a red fox in the snow\na lighthouse at dusk\n")
    extra = RANDOM_WEIGHTS + OFFLINE_REWARD if "--model" in args or "--reward" in args else []
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", *args, *extra, "--dry-run", "--json"]
    cmd += ["--nproc-per-node", str(procs)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (shlex.join(cmd), r.stderr[-3000:])
    plan = json.loads(r.stdout)
    assert plan["processes"] == procs and plan["prompts"]["per_process"] >= 1
    assert plan["prompts"]["per_iteration"] == plan["prompts"]["per_process"] * procs


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("doc, procs, args", doc_lines(), ids=lambda x: str(x)[:60] if isinstance(x, list) else None)
def test_the_printed_line_trains_on_one_and_two_processes(doc, procs, args, nproc, tmp_path):
    if procs < nproc:
        pytest.skip("the line names fewer processes")
    (tmp_path / "prompts.txt").write_text("a red fox in the snow\na lighthouse at dusk\n")
    released = "--model" in args  # its weights and its default reward's (HPS) are not on this machine
    extra = RANDOM_WEIGHTS + OFFLINE_REWARD if released or "--reward" in args else []
    cmd = [sys.executable, "-m", "treegrpo_cli", "train", *args, *SHORT, *extra, "--run-dir", "run"]
    cmd += ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (shlex.join(cmd), r.stderr[-3000:])
    assert (tmp_path / "run" / "checkpoints" / "step-1").is_dir()
    if nproc == 2 and "num_prompts" in r.stderr:
        assert "for each of 2 processes" in r.stderr
