"""The whole pre-flight (training/needs.py) and `train --dry-run` (training/dryrun.py): every name and file a command
needs is checked before any weights load and before anything is printed, every missing one named in one line; the
dry run reports what a run would use and cost, loading nothing, its counts those the training logs."""

import json

import pytest
from clitools import one_line_error, run

from treegrpo_cli.models import catalog, hub, registry, releases
from treegrpo_cli.training.runlog import read_metrics

REWARD_VARS = (
    "TREEGRPO_HPS_CHECKPOINT",
    "TREEGRPO_PICKSCORE_MODEL",
    "TREEGRPO_PICKSCORE_PROCESSOR",
    "TREEGRPO_IMAGEREWARD_CHECKPOINT",
    "TREEGRPO_BERT_TOKENIZER",
)
FLUX = "black-forest-labs/FLUX.1-dev"
RANDOM_TINY = ["--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch, tmp_path_factory):
    """A machine with no weights: an empty hub cache, no reward variables."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("empty-hub")))
    for var in REWARD_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "my.txt"
    path.write_text("a red fox in the snow\na lighthouse at dusk\n")
    return path


def _refused_at_once(r, *needles):
    """One error line on stderr, naming every needle, and nothing printed before it (stdout empty too)."""
    one_line_error(r, *needles)
    assert r.stderr.count("\n") == 1 and r.stdout == "", r.output


# --- A: the pre-flight -----------------------------------------------------------------------


def test_train_names_the_models_and_every_rewards_files_in_one_line_before_anything(tmp_path, prompts):
    """The issue's acceptance test: no weights on the machine -> ONE error naming FLUX.1-dev's snapshot (gated, with
    the token note), HPS's and PickScore's files, each with how to supply it; no header, no run folder."""
    args = ["--model", "flux-dev", "--preset", "branch-mix-flow", "--reward", "hps,pick", "--prompts", prompts]
    r = run("train", *args, "--run-dir", tmp_path / "r")
    _refused_at_once(
        r,
        "3 things",
        "model weights for 'flux-dev'",
        f"hf download {FLUX}",
        "gated repository",
        "$HF_TOKEN",
        "hps weights not found",
        "TREEGRPO_HPS_CHECKPOINT",
        "hps.checkpoint",
        "pick weights not found",
        "TREEGRPO_PICKSCORE_MODEL",
        "TREEGRPO_PICKSCORE_PROCESSOR",
    )
    assert r.exit_code == 1 and not (tmp_path / "r").exists()
    assert r.stderr.index("flux-dev") < r.stderr.index("hps weights") < r.stderr.index("pick weights")


@pytest.mark.parametrize(
    "model, meant",
    [("flux-devv", "flux-dev"), ("FLUX.1-dev", "flux-dev"), ("Flux-Dev", "flux-dev"), ("TINY-SHAPES", "tiny-shapes")],
)
def test_a_model_typo_is_refused_before_the_header_with_the_name_meant(tmp_path, model, meant):
    r = run("train", "--model", model, "--run-dir", tmp_path / "r")
    _refused_at_once(r, f"unknown model {model!r}", f"did you mean {meant!r}")
    assert r.exit_code == 2 and not (tmp_path / "r").exists()


def test_a_path_that_is_no_model_is_refused_before_the_header(tmp_path):
    r = run("train", "--model", "/dev/null", "--run-dir", tmp_path / "r")
    _refused_at_once(r, "unknown model '/dev/null'")
    assert "starting" not in r.stderr and "reward jpeg" not in r.stderr
    r = run("train", "--model", tmp_path / "gone.safetensors", "--run-dir", tmp_path / "r")
    _refused_at_once(r, "model weights not found", "gone.safetensors")


def test_a_release_by_its_hub_id_says_the_release_name_and_the_gate(tmp_path):
    r = run("train", "--model", FLUX, "--reward", "jpeg-compressibility", "--run-dir", tmp_path / "r")
    _refused_at_once(
        r, f"model weights for {FLUX!r}", f"hf download {FLUX}", "gated", "did you mean --model 'flux-dev'"
    )


def test_a_reward_in_another_case_gets_its_name_and_is_named_with_the_rest(tmp_path):
    r = run("train", "--reward", "HPS", "--run-dir", tmp_path / "r")
    _refused_at_once(r, "unknown reward 'HPS'", "did you mean 'hps'")
    r = run("train", "--model", "Flux-Dev", "--reward", "PickScore,hps", "--run-dir", tmp_path / "r")
    _refused_at_once(r, "3 things", "did you mean 'flux-dev'", "did you mean 'pick'", "hps weights not found")
    assert r.exit_code == 2  # unknown names among them: a usage error


def test_gated_releases_are_marked_on_their_cards():
    gated = {r for e in catalog.entries().values() for r in e.card.gated}
    served = {r for e in catalog.entries().values() for r in e.card.releases}
    assert {"flux-dev", "sd3.5-medium", "sd3.5-large", "flux2-dev"} <= gated <= served
    assert not {"flux-schnell", "qwen-image", "wan2.1-t2v-1.3b", "flux2-klein-4b"} & gated
    assert "gated" in hub.gated_note(FLUX) and "gated" in hub.gated_note(FLUX.lower())
    assert hub.gated_note("black-forest-labs/FLUX.1-schnell") == "" and hub.gated_note("Qwen/Qwen-Image") == ""
    assert [hub.release_of(n) for n in (FLUX, "FLUX.1-dev", "flux.1-DEV", "Qwen-Image", "nope")] == [
        "flux-dev",
        "flux-dev",
        "flux-dev",
        "qwen-image",
        None,
    ]


def test_eval_names_every_metrics_files_in_one_line():
    r = run("eval", "--model", "pixel-tiny", "--metric", "hps,pick,imagereward")
    _refused_at_once(
        r,
        "3 things",
        "hps weights not found",
        "pick weights not found",
        "imagereward weights not found",
        "TREEGRPO_IMAGEREWARD_CHECKPOINT",
    )


def _checkpoint(run_dir):
    """A pixel-tiny training checkpoint (its base weights; a run's config)."""
    import torch

    from treegrpo_cli.config import load_config
    from treegrpo_cli.store.checkpoint import Checkpoint, save_checkpoint

    cfg = load_config(sets=['model="pixel-tiny"'])
    state = registry.load_policy("pixel-tiny").trainable_state()
    meta = {"step": 1, "seed": 0, "config": cfg.to_dict()}
    ck = Checkpoint(
        step=1,
        model=state,
        ema=None,
        optimizer={"state": {}, "param_groups": []},
        rng={"torch": torch.get_rng_state()},
        state=meta,
    )
    save_checkpoint(run_dir / "checkpoints", ck, keep_last=2)


def test_eval_refuses_a_baseline_without_weights_before_sampling_anything(tmp_path, monkeypatch):
    from treegrpo_cli.report import evaluate

    _checkpoint(tmp_path / "run")
    monkeypatch.setattr(evaluate, "load_source_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    base = ["eval", "--checkpoint", tmp_path / "run", "--metric", "jpeg-compressibility", "--num-prompts", 1]
    _refused_at_once(run(*base, "--baseline", "flux-dev"), "--baseline flux-dev", f"hf download {FLUX}", "gated")
    _refused_at_once(run(*base, "--baseline", "flux-devv"), "--baseline flux-devv", "did you mean 'flux-dev'")


# --- B: train --dry-run ----------------------------------------------------------------------


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every way weights come into a process fails the test: the registry's loader, the embedded file's reader, the
    random weights' filler."""
    from treegrpo_cli.models import latent_file

    def fail(*a, **k):
        pytest.fail("weights were loaded")

    monkeypatch.setattr(registry, "load_policy", fail)
    monkeypatch.setattr(latent_file, "load_weights", fail)
    monkeypatch.setattr(releases, "random_module", fail)


def _dry(*args):
    r = run("train", "--dry-run", "--json", *args)
    return r, json.loads(r.stdout)


def test_dry_run_of_the_default_reports_and_loads_nothing(nothing_loads, tmp_path):
    r, rep = _dry("--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert rep["missing"] == [] and rep["model"] == "tiny-shapes" and rep["rewards"] == ["shapes"]
    assert rep["prompts"]["train"] > 0 and rep["prompts"]["per_iteration"] == rep["prompts"]["per_process"] == 16
    it = rep["iteration"]
    assert it["rollout_evals"] > 0 and it["trained_edges"] > 0 and it["flops"] > 0 and rep["processes"] == 1
    assert 0 < rep["memory"]["peak_gb_per_process"] < 1 and rep["memory"]["dtype"] == "fp32"
    assert [x["layer"] for x in rep["config_layers"]][0] == "preset tree-grpo-mean"
    assert not (tmp_path / "r").exists()
    text = run("train", "--dry-run")
    assert text.exit_code == 0 and "model evaluations (rollout forwards)" in text.stdout
    assert "TFLOPs" in text.stdout and "memory per process" in text.stdout and "nothing missing" in text.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, exact",
    [
        ([], True),
        (["--preset", "nft"], True),
        (["--preset", "tree-awm"], True),
        (["--model", "flux-dev", *RANDOM_TINY, "--reward", "jpeg-compressibility"], True),
        (["--preset", "branch-mix-flow"], False),  # the shapes reward ties some groups: they train nothing
    ],
)
def test_the_dry_runs_counts_are_what_a_real_iteration_logs(tmp_path, model, exact):
    """Not the same formula twice: the dry run plans with a stand-in policy and the model's header or meta-device
    configs; the real iteration samples the model and counts what it ran. Where rewards tie, the dry run's trained
    edges are the most the rewards allow."""
    small = ["--iterations", 1, "--set", "train.eval_samples=0"]
    small += ["--num-prompts", 2, "--set", "sampler.steps=4"] if "flux-dev" in model else []
    r, rep = _dry(*model, *small)
    assert r.exit_code == 0, r.output
    assert run("train", *model, *small, "--run-dir", tmp_path / "r").exit_code == 0
    row = read_metrics(tmp_path / "r")[0]
    it = rep["iteration"]
    assert it["rollout_evals"] == row["rollout_evals"] and row["flops"] > 0
    keys = ("trained_edges", "train_evals", "flops")
    if exact:
        assert [it[k] for k in keys] == [row[k] for k in keys]
    else:
        assert all(it[k] >= row[k] for k in keys) and it["trained_edges"] > row["trained_edges"]
        assert any("zero advantage" in why for why in it["rewards_may_lower"])


def test_dry_run_of_flux_dev_without_weights_names_them_and_exits_2(nothing_loads, prompts):
    r = run("train", "--dry-run", "--model", "flux-dev", "--preset", "branch-mix-flow", "--prompts", prompts)
    assert r.exit_code == 2, r.output
    assert "missing (2)" in r.stdout and f"hf download {FLUX}" in r.stdout and "hps weights not found" in r.stdout
    assert "model evaluations" in r.stdout and "memory per process" in r.stdout  # the costs are known all the same
    r, rep = _dry("--model", "flux-dev", "--reward", "jpeg-compressibility")
    assert r.exit_code == 2 and len(rep["missing"]) == 1 and FLUX in rep["missing"][0]
    assert rep["memory"]["parts_gb"]["text encoders"] > 9  # T5-XXL and CLIP-L in bf16


def test_dry_run_of_flux_dev_random_tiny_exits_0_with_numbers(nothing_loads):
    r, rep = _dry("--model", "flux-dev", *RANDOM_TINY, "--reward", "jpeg-compressibility")
    assert r.exit_code == 0 and rep["missing"] == [], r.output
    assert rep["weights"] == "random weights, tiny size" and rep["model_cost"]["text_encoders"] == 0
    assert rep["iteration"]["rollout_evals"] > 0 and rep["iteration"]["flops"] > 0
    assert 0 < rep["memory"]["peak_gb_per_process"] < 0.1


def test_dry_run_memory_is_the_model_tables(nothing_loads):
    """flux-dev with LoRA and an EMA: the denoiser and adapter sizes of bench/results/model_memory.json, and its
    LoRA figure 2P + 20A (frozen bf16 weights; fp32 adapters, gradients, Adam, EMA)."""
    from pathlib import Path

    table = json.loads((Path(__file__).parents[1] / "bench" / "results" / "model_memory.json").read_text())
    flux = next(m for m in table["models"] if m["model"] == "flux-dev")
    r, rep = _dry("--model", "flux-dev", "--reward", "jpeg-compressibility", "--set", "train.ema_decay=0.9")
    c, parts = rep["model_cost"], rep["memory"]["parts_gb"]
    assert c["denoiser"] / 1e9 == pytest.approx(flux["params_b"], rel=1e-6)
    assert c["trained"] / 1e9 == pytest.approx(flux["lora_params_b"], rel=1e-6)
    vae = c["autoencoder"] * 2 / 1e9
    lora_gb = parts["frozen weights"] - vae + parts["trained weights and optimizer"]
    assert lora_gb == pytest.approx(flux["lora_gb"], rel=1e-6)
    assert parts["text encoders"] == pytest.approx(flux["text_encoders_gb"], rel=1e-6)


def test_dry_run_splits_the_prompts_over_the_processes_without_launching_them(nothing_loads, monkeypatch):
    from treegrpo_cli.cli import launch

    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("processes were launched"))
    r, rep = _dry("--nproc-per-node", 3)
    assert r.exit_code == 0 and rep["processes"] == 3
    assert rep["prompts"]["per_iteration"] == 18 and rep["prompts"]["per_process"] == 6  # 16 -> a multiple of 3
    monkeypatch.setenv("WORLD_SIZE", "2")
    r, rep = _dry()
    assert rep["processes"] == 2 and rep["prompts"]["per_process"] == 8


def test_dry_run_names_typos_and_refuses_trees(tmp_path):
    r, rep = _dry("--model", "flux-devv", "--reward", "HPS")
    assert r.exit_code == 2 and rep["iteration"] is None
    assert "did you mean 'flux-dev'" in rep["missing"][0] and "did you mean 'hps'" in rep["missing"][1]
    one_line_error(run("train", "--dry-run", "--trees", tmp_path), "--dry-run", "--trees")
