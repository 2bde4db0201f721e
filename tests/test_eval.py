"""`treegrpo eval`: metrics of generated samples, checkpoints and image folders; streaming; errors."""

import csv
import json

import pytest
import torch
from clitools import one_line_error, run
from PIL import Image

from treegrpo_cli.config import load_config
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.report.evaluate import EvalRequest, run_eval
from treegrpo_cli.rewards import base
from treegrpo_cli.store.checkpoint import Checkpoint, save_checkpoint
from treegrpo_cli.training import sampling
from treegrpo_cli.training.runlog import read_evals

SHAPES = ("--model", "tiny-shapes", "--num-prompts", 3)


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("empty-hub")))
    monkeypatch.delenv("TREEGRPO_HPS_CHECKPOINT", raising=False)


@pytest.mark.slow
def test_eval_shapes_prints_the_table_and_writes_the_files(tmp_path):
    out = tmp_path / "ev"
    r = run("eval", *SHAPES, "--num-images", 2, "--batch", 4, "--metric", "shapes", "--out", out)
    assert r.exit_code == 0, r.output
    assert "shapes" in r.stdout and "mean" in r.stdout and "std" in r.stdout
    summary = json.loads((out / "results.json").read_text())
    assert summary["metrics"]["shapes"]["n"] == 6 and summary["sampling"] == "ode"
    assert summary["source"] == {"model": "tiny-shapes"}
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 6 and {"source", "prompt_id", "sample", "prompt", "shapes"} <= set(rows[0])
    mean = sum(float(row["shapes"]) for row in rows) / 6
    assert abs(mean - summary["metrics"]["shapes"]["mean"]) < 1e-6
    with Image.open(out / "samples.png") as im:
        assert im.width >= 3 * 32 * 4  # 6 captioned images, 3 per row, scaled 4x


@pytest.mark.slow
def test_eval_json_is_independent_of_the_batch_size():
    args = ("eval", *SHAPES, "--num-images", 2, "--steps", 8, "--metric", "shapes,jpeg-compressibility", "--json")
    one, big = run(*args, "--batch", 1), run(*args, "--batch", 64)
    assert one.exit_code == 0 and big.exit_code == 0, one.output + big.output
    a, b = json.loads(one.stdout)["metrics"], json.loads(big.stdout)["metrics"]
    assert set(a) == {"shapes", "jpeg-compressibility"} and set(a["shapes"]) == {"mean", "std", "n"}
    for name in a:
        assert a[name]["n"] == 6 and abs(a[name]["mean"] - b[name]["mean"]) < 1e-6
    sde = json.loads(run(*args, "--sde").stdout)
    assert (
        sde["sampling"] == "sde" and sde["metrics"]["jpeg-compressibility"]["mean"] != a["jpeg-compressibility"]["mean"]
    )


def test_eval_hps_without_weights_is_one_line(monkeypatch):
    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated before checking the weights"))
    r = run("eval", *SHAPES, "--metric", "shapes,hps")
    one_line_error(r, "HPS_v2.1_compressed.pt", "TREEGRPO_HPS_CHECKPOINT", "--reward-opt hps.checkpoint")
    assert "Traceback" not in r.output


@pytest.mark.slow
def test_eval_hps_with_tiny_weights_through_reward_opt(tmp_path):
    open_clip = pytest.importorskip("open_clip")
    cfg = {
        "embed_dim": 8,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 16, "patch_size": 16, "head_width": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    }
    (tmp_path / "treegrpo-test-eval.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path / "treegrpo-test-eval.json")
    torch.manual_seed(0)
    torch.save({"state_dict": open_clip.create_model("treegrpo-test-eval").state_dict()}, tmp_path / "hps.pt")
    r = run(
        "eval",
        *SHAPES,
        "--metric",
        "hps",
        "--json",
        "--reward-opt",
        f"hps.checkpoint={tmp_path / 'hps.pt'}",
        "--reward-opt",
        "hps.arch=treegrpo-test-eval",
    )
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["metrics"]["hps"]
    assert m["n"] == 3 and -1 <= m["mean"] <= 1
    assert "initialized randomly" not in r.stderr  # loading is silent: no library chatter


class Probe:
    """A reward that records the size of every batch it scores."""

    name = "probe-test"
    seen: list[int] = []

    def __call__(self, images, prompts):
        Probe.seen.append(len(prompts))
        assert images.shape[0] == len(prompts) and images.dtype == torch.float32
        return images.mean((1, 2, 3))


def test_256_images_stream_in_batches_with_progress(monkeypatch):
    base.register(Probe.name, Probe)
    Probe.seen = []
    trees: list[int] = []
    real = sampling.rollout
    monkeypatch.setattr(
        sampling,
        "rollout",
        lambda policy, prompts, *a, **k: trees.append(len(prompts)) or real(policy, prompts, *a, **k),
    )
    calls = []
    req = EvalRequest(
        metrics=(Probe.name,),
        prompts=[f"prompt {i}" for i in range(64)],
        model="pixel-tiny",
        num_images=4,
        steps=2,
        batch=32,
    )
    summary, scored = run_eval(req, lambda phase, done, total: calls.append((phase, done, total)))
    assert summary["metrics"][Probe.name]["n"] == 256
    assert Probe.seen == [32] * 8 and trees == [32] * 8  # never more than a batch at a time
    assert [c for c in calls if c[0] == "score"] == [("score", 32 * k, 256) for k in range(1, 9)]
    assert [c for c in calls if c[0] == "generate"] == [("generate", 32 * k, 256) for k in range(1, 9)]
    assert scored["model"].grid.shape == (16, 3, 8, 8) and len(scored["model"].rows) == 256
    keys = {(r["prompt_id"], r["sample"]) for r in scored["model"].rows}
    assert keys == {(p, j) for p in range(64) for j in range(4)}


def _checkpoint(run_dir, shift_model: float, shift_ema: float):
    """A pixel-tiny training checkpoint whose weights are the base weights moved by a constant."""
    cfg = load_config(sets=['model="pixel-tiny"'])
    state = load_policy("pixel-tiny").trainable_state()

    def moved(d: float) -> dict:
        return {k: v + d for k, v in state.items()}

    ck = Checkpoint(
        step=1,
        model=moved(shift_model),
        ema=moved(shift_ema),
        optimizer={"state": {}, "param_groups": []},
        rng={"torch": torch.get_rng_state()},
        state={"step": 1, "seed": 0, "config": cfg.to_dict()},
    )
    return save_checkpoint(run_dir / "checkpoints", ck, keep_last=2)


@pytest.mark.slow
def test_eval_checkpoint_uses_ema_and_pairs_with_the_baseline(tmp_path):
    _checkpoint(tmp_path / "run", 0.0, 0.05)
    args = (
        "eval",
        "--checkpoint",
        tmp_path / "run",
        "--num-prompts",
        4,
        "--num-images",
        2,
        "--steps",
        3,
        "--metric",
        "jpeg-compressibility",
        "--baseline",
        "pixel-tiny",
        "--json",
    )
    ema, plain = (json.loads(run(*args, *extra).stdout) for extra in ((), ("--no-ema",)))
    assert ema["source"]["weights"] == "ema" and plain["source"]["weights"] == "trained"
    assert ema["source"]["step"] == 1 and ema["baseline"] == {"model": "pixel-tiny"}
    m = plain["metrics"]["jpeg-compressibility"]
    assert m["delta"] == 0.0 and m["baseline_mean"] == m["mean"]  # same weights, same noises
    assert ema["metrics"]["jpeg-compressibility"]["delta"] != 0.0
    table = run(*args[:-1])
    assert table.exit_code == 0 and "delta" in table.stdout and "baseline: pixel-tiny" in table.stdout


def _folder(path, n, seed, mapping="json"):
    path.mkdir()
    g = torch.Generator().manual_seed(seed)
    names = {}
    for i in range(n):
        arr = torch.randint(0, 256, (16, 16, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(arr).save(path / f"{i:03d}.png")
        names[f"{i:03d}.png"] = f"prompt {i}"
    if mapping == "json":
        (path / "prompts.json").write_text(json.dumps(names))
    else:
        (path / "prompts.csv").write_text("image,prompt\n" + "".join(f"{k},{v}\n" for k, v in names.items()))
    return path


def test_eval_scores_an_image_folder(tmp_path):
    _folder(tmp_path / "a", 5, 0)
    _folder(tmp_path / "b", 3, 1, mapping="csv")
    r = run("eval", "--images", tmp_path / "a", "--metric", "jpeg-incompressibility", "--batch", 2, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["sampling"] == "folder" and s["metrics"]["jpeg-incompressibility"]["n"] == 5
    r = run(
        "eval",
        "--images",
        tmp_path / "b",
        "--baseline",
        tmp_path / "a",
        "--metric",
        "jpeg-incompressibility",
        "--out",
        tmp_path / "out",
        "--json",
    )
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["metrics"]["jpeg-incompressibility"]
    assert m["n"] == 3 and m["baseline_n"] == 5 and abs(m["delta"] - (m["mean"] - m["baseline_mean"])) < 1e-9
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert [r["source"] for r in rows] == ["model"] * 3 + ["baseline"] * 5 and rows[0]["file"] == "000.png"
    assert (tmp_path / "out" / "samples-baseline.png").is_file()
    (tmp_path / "a" / "prompts.json").unlink()
    one_line_error(run("eval", "--images", tmp_path / "a"), "prompts.json")


@pytest.mark.slow
def test_eval_usage_errors(tmp_path, monkeypatch):
    one_line_error(run("eval", "--model", "pixel", "--checkpoint", "x"), "not both")
    r = run("eval", "--metric", "hsp")
    one_line_error(r, "unknown reward 'hsp'", "did you mean 'hps'")
    assert r.exit_code == 2
    one_line_error(run("eval", "--metric", "shapes", "--reward-opt", "hps.checkpoint=/x"), "--metric does not name")
    one_line_error(run("eval", "--reward-opt", "hps.nope=1"), "no option 'nope'")
    one_line_error(run("eval", "--checkpoint", "/nonexistent/run"), "no training checkpoint")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(sampling, "rollout", lambda *a, **k: pytest.fail("generated before checking --out"))
    one_line_error(run("eval", *SHAPES, "--out", tmp_path / "a-file"), "exists and is not a folder")


@pytest.mark.slow
def test_eval_of_a_run_repeats_its_last_held_out_evaluation(tmp_path):
    """`eval --checkpoint RUN --seed S` with the run's defaults (held-out prompts, samples per prompt, sampler,
    rewards) draws the images of the run's own held-out evaluation: the EMA's by default (the row's reward_mean),
    the trained weights' with --no-ema (its raw/ fields); another seed draws others."""
    (tmp_path / "held-out.txt").write_text("a red circle\ntwo blue squares\na green triangle\n")
    r = run(
        "train",
        "--iterations",
        2,
        "--seed",
        3,
        "--reward",
        "jpeg-compressibility,shapes",
        "--weights",
        "0.7,0.3",
        "--run-dir",
        tmp_path / "r",
        *("--set", "rollout.num_prompts=2", "--set", f'rollout.eval_prompts="{tmp_path / "held-out.txt"}"'),
        *("--set", "train.eval_samples=2", "--set", "train.sample_every=0", "--set", "sampler.steps=4"),
        *("--set", "train.ema_decay=0.5", "--set", "train.ema_every=0"),  # an EMA apart from the trained weights
    )
    assert r.exit_code == 0, r.output
    last = read_evals(tmp_path / "r")[-1]
    assert last["iteration"] == 2 and last["samples"] == 2 and last["prompts"] == 3 and last["weights"] == "ema"
    assert last["raw/reward_mean"] != last["reward_mean"]

    def eval_(seed, *extra):
        r = run("eval", "--checkpoint", tmp_path / "r", "--seed", seed, "--json", *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    weights = {"jpeg-compressibility": 0.7, "shapes": 0.3}
    for extra, prefix, said in (((), "", "ema"), (("--no-ema",), "raw/", "trained")):
        s = eval_(3, *extra)
        assert s["source"]["weights"] == said and s["source"]["step"] == 2 and s["images"] == 6
        means = {n: m["mean"] for n, m in s["metrics"].items()}
        assert set(means) == set(weights)
        for n in weights:
            assert means[n] == pytest.approx(last[f"{prefix}rewards/{n}/mean"], abs=1e-6)
        assert sum(w * means[n] for n, w in weights.items()) == pytest.approx(last[f"{prefix}reward_mean"], abs=1e-6)
    other = eval_(4, "--metric", "jpeg-compressibility")["metrics"]["jpeg-compressibility"]["mean"]
    assert abs(other - last["rewards/jpeg-compressibility/mean"]) > 1e-4
