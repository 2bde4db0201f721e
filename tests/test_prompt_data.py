"""A researcher's own prompts: every file form with its metadata, the metadata into tree folders, run folders and
reward calls (the shapes verifier and a plugin read it), held-out prompts of their own or split from the training
file, and an evaluation cadence in iterations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import PIXEL, one_line_error, run

from treegrpo_cli.engine.prompt import Prompt, prompt_meta
from treegrpo_cli.prompts import load_prompts, split_prompts
from treegrpo_cli.rewards.remote import decode_request
from treegrpo_cli.rewards.shapes import ShapesReward
from treegrpo_cli.store.trees import open_trees, read_tree_shard
from treegrpo_cli.training.runlog import read_evals, read_metrics, without_timings
from treegrpo_cli.world.shapes import render_prompts

RECORDS = [
    {"prompt": "my own words for two red circles", "include": [{"class": "circle", "color": "red", "count": 2}]},
    {"prompt": "a blue square", "tag": "single_object", "difficulty": 3},
]


def write_all_forms(folder: Path) -> dict[str, Path]:
    """The two records in every form a prompts file may take."""
    folder.mkdir(parents=True, exist_ok=True)
    forms = {"jsonl": folder / "p.jsonl", "json": folder / "p.json", "csv": folder / "p.csv", "tsv": folder / "p.tsv"}
    forms["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    forms["json"].write_text(json.dumps(RECORDS))
    forms["csv"].write_text('prompt,tag\n"my own words, with a comma",x\na blue square,single_object\n')
    forms["tsv"].write_text("prompt\ttag\nmy own words\tx\na blue square\tsingle_object\n")
    return forms


def test_every_file_form_keeps_each_records_other_fields_as_metadata(tmp_path):
    forms = write_all_forms(tmp_path)
    for form in ("jsonl", "json"):
        got = load_prompts(forms[form])
        assert got == [r["prompt"] for r in RECORDS] and all(isinstance(p, Prompt) for p in got)
        assert prompt_meta(got[0])["include"][0]["count"] == 2 and prompt_meta(got[1]) == {
            "tag": "single_object",
            "difficulty": 3,
        }
    csv_prompts = load_prompts(forms["csv"])  # the header is a header, not a prompt
    assert csv_prompts == ["my own words, with a comma", "a blue square"] and csv_prompts[1].meta == {
        "tag": "single_object"
    }
    assert load_prompts(forms["tsv"])[0].meta == {"tag": "x"}
    (tmp_path / "plain.txt").write_text("one\n\n two \n")
    assert load_prompts(tmp_path / "plain.txt") == ["one", "two"]


def test_parquet_and_a_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(
        [{"prompt": "a red circle", "text": "OPEN", "n": 1}, {"prompt": "a blue square", "text": "SHUT", "n": 2}]
    )
    ds.to_parquet(str(tmp_path / "p.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "p.parquet", tmp_path / "saved"):
        got = load_prompts(path)
        assert got == ["a red circle", "a blue square"] and got[1].meta == {"text": "SHUT", "n": 2}, path
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "splits"))
    one_line_error(run("rollout", *PIXEL, "--prompts", tmp_path / "splits", "--out", tmp_path / "o"), "test, train")


@pytest.mark.parametrize(
    "name, body, needle",
    [
        ("p.yaml", "- a red circle\n", "not a prompts format; use .txt, .jsonl"),
        ("p.csv", "text,tag\na red circle,x\n", "no `prompt` column (found 'text', 'tag')"),
        ("p.json", '{"prompt": "a"}', "expected a list of prompts"),
        ("p.jsonl", '{"prompt": ""}\n', 'non-empty "prompt"'),
        ("p.csv", "prompt\n\n,\n", 'non-empty "prompt"'),
    ],
)
def test_other_input_is_one_line_naming_the_accepted_forms(tmp_path, name, body, needle):
    (tmp_path / name).write_text(body)
    one_line_error(run("rollout", *PIXEL, "--prompts", tmp_path / name, "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()


def test_the_shapes_verifier_reads_its_targets_from_metadata():
    image = render_prompts(["two red circles"], 0).float() / 255.0  # [1, 3, H, W]
    reward = ShapesReward()
    own_words = "my own words"  # outside the world's grammar: 0 without metadata
    meta = {"include": [{"class": "circle", "color": "red", "count": 2}]}
    assert reward(image, [own_words]).item() == 0.0
    assert reward(image, [Prompt(own_words, meta)]).item() == pytest.approx(reward(image, ["two red circles"]).item())
    wrong = {"include": [{"class": "square", "color": "blue"}]}
    assert reward(image, [Prompt("two red circles", wrong)]).item() < 0.2  # the metadata wins over the text
    left = {
        "include": [{"class": "circle", "color": "red"}, {"class": "square", "color": "blue", "position": ["x", 0]}]
    }
    with pytest.raises(Exception, match="position must be"):
        reward(image, [Prompt("p", left)])


def test_metadata_travels_into_tree_folders_and_to_every_reward_call(tmp_path):
    forms = write_all_forms(tmp_path)
    seen = tmp_path / "seen.jsonl"
    plugin = tmp_path / "metareward.py"
    plugin.write_text(
        "import json, torch\n"
        f"def score(images, prompts):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        for p in prompts:\n"
        "            f.write(json.dumps(getattr(p, 'meta', None)) + '\\n')\n"
        "    return torch.zeros(len(prompts))\n"
    )
    out = tmp_path / "trees"
    r = run("rollout", *PIXEL, "--prompts", forms["jsonl"], "-n", 2, "--preset", "branch", "--out", out)
    assert r.exit_code == 0, r.output
    store = open_trees(out)
    shard = read_tree_shard(store, store.names("trees")[0])
    assert [p.meta for p in shard.prompts.values()] == [{k: v for k, v in x.items() if k != "prompt"} for x in RECORDS]
    r = run("score", out, "--reward", f"{plugin}:score")
    assert r.exit_code == 0, r.output
    metas = [json.loads(line) for line in seen.read_text().splitlines()]
    assert metas and {"tag": "single_object", "difficulty": 3} in metas and all(m is not None for m in metas)


def test_the_reward_server_gets_each_prompts_metadata():
    body = {
        "version": 1,
        "reward": "shapes",
        "prompts": ["a", "b"],
        "meta": [{"text": "A"}, {}],
        "images": {"dtype": "uint8", "shape": [2, 3, 1, 1], "data": "AAAAAAAA"},
    }
    _, _, prompts = decode_request(json.dumps(body).encode(), {"shapes": None})
    assert [p.meta for p in prompts] == [{"text": "A"}, {}]
    body["meta"] = [{}]
    with pytest.raises(ValueError, match="one object per prompt"):
        decode_request(json.dumps(body).encode(), {"shapes": None})


def test_a_seeded_held_out_split():
    prompts = [Prompt(f"p{i}") for i in range(10)]
    train, held = split_prompts(prompts, 3, seed=7)
    assert len(held) == 3 and len(train) == 7 and set(train) | set(held) == set(prompts)
    assert split_prompts(prompts, 3, seed=7) == (train, held) and split_prompts(prompts, 3, seed=8) != (train, held)
    assert len(split_prompts(prompts, 0.2, seed=0)[1]) == 2
    with pytest.raises(Exception, match="at least one on each side"):
        split_prompts(prompts, 10, seed=0)


FAST = [*PIXEL, "--set", "rollout.num_prompts=2", "--set", "train.sample_every=0", "--set", "train.eval_samples=1"]


@pytest.mark.slow
def test_held_out_prompts_from_a_file_or_a_split_drive_the_curve_and_eval(tmp_path):
    own = tmp_path / "held.txt"
    own.write_text("a red circle\na blue square\na green triangle\n")
    r = run("train", *FAST, "--eval-prompts", own, "--iterations", 2, "--run-dir", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert {row["prompts"] for row in read_evals(tmp_path / "a")} == {3}
    lines = [json.dumps({"prompt": f"a red circle number {i}"}) for i in range(8)]
    (tmp_path / "eight.jsonl").write_text("\n".join(lines) + "\n")
    args = ["--prompts", tmp_path / "eight.jsonl", "--eval-split", 3, "--set", "train.eval_every=1"]
    r = run("train", *FAST, *args, "--iterations", 2, "--run-dir", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert "held out: 3 of them, drawn with the seed" in r.stderr
    evals = read_evals(tmp_path / "b")
    assert [e["iteration"] for e in evals] == [0, 1, 2] and {e["prompts"] for e in evals} == {3}  # every iteration
    r = run("eval", "--checkpoint", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["prompts"] == 3  # the run's own held-out prompts


@pytest.mark.slow
def test_a_resume_with_metadata_prompts_a_schedule_and_a_plugin_repeats_the_run(tmp_path):
    """Killed after its second checkpoint (TREEGRPO_FAULT), resumed: the uninterrupted run's rows."""
    records = [{"prompt": f"shape {i}", "include": [{"class": "circle", "color": c}]} for i, c in enumerate("rgb")]
    records = [{**r, "include": [{**r["include"][0], "color": {"r": "red", "g": "green", "b": "blue"}[c]}]}
               for r, c in zip(records, "rgb", strict=True)]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "from treegrpo_cli.rewards.shapes import ShapesReward\n"
        "def score(images, prompts):\n"
        "    return ShapesReward()(images, prompts) + torch.tensor([len(p.meta) for p in prompts])\n"
    )
    args = ["train", "--prompts", "p.jsonl", "--reward", "mine.py:score", "--set", "train.lr_schedule=cosine"]
    args += ["--set", "train.warmup_iterations=1", *FAST, "--set", "train.save_every=1", "--iterations", 4]

    def proc(*extra, fault=None):
        env = dict(os.environ, OMP_NUM_THREADS="1", **({"TREEGRPO_FAULT": fault} if fault else {}))
        cmd = [sys.executable, "-m", "treegrpo_cli", *map(str, extra)]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert proc(*args, "--run-dir", "whole").returncode == 0
    r = proc(*args, "--run-dir", "cut", fault="checkpoint.renamed@2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    r = proc("train", "--resume", "cut")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = without_timings(read_metrics(tmp_path / "whole"))
    assert rows == without_timings(read_metrics(tmp_path / "cut")) and len(rows) == 4
    assert rows[0]["lr"] < rows[1]["lr"]  # the warm-up
    assert all(row["reward_mean"] > 0.9 for row in rows)  # the plugin saw each prompt's metadata (1 field)
    info = json.loads((tmp_path / "whole" / "run.json").read_text())
    assert info["prompts"]["train"]["count"] == 3


@pytest.mark.slow
def test_changed_metadata_is_refused_at_resume(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a red circle", "k": 1}\n{"prompt": "a blue square"}\n')
    d = tmp_path / "r"
    assert run("train", *FAST, "--prompts", tmp_path / "p.jsonl", "--iterations", 1, "--run-dir", d).exit_code == 0
    (tmp_path / "p.jsonl").write_text('{"prompt": "a red circle", "k": 2}\n{"prompt": "a blue square"}\n')
    one_line_error(run("train", "--resume", d, "--iterations", 2), "changed since")
