"""policy.weights = "random": every released adapter through the whole command line (train, resume, export, eval)
with nothing downloaded and no text encoder, at policy.size = "tiny" on the CPU."""

import json

import pytest
import torch
from clitools import one_line_error, run

from treegrpo_cli.models import releases

# one release per adapter
ADAPTERS = {
    "flux": "flux-dev",
    "sd3": "sd3.5-medium",
    "sd": "sd1.5",
    "qwenimage": "qwen-image",
    "flux2": "flux2-klein-4b",
    "wan": "wan2.1-t2v-1.3b",
}
RANDOM = ["--set", 'policy.weights="random"', "--set", 'policy.size="tiny"']


def small(prompts) -> list[str]:
    sets = {
        "rollout.num_prompts": 2,
        "sampler.steps": 4,
        "train.eval_samples": 1,
        "rollout.eval_prompts": json.dumps(str(prompts)),
    }
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "two.txt"
    path.write_text("a red fox in the snow\na lighthouse at dusk\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_a_release_with_random_weights_runs_the_whole_cli(adapter, prompts, tmp_path):
    name, run_dir = ADAPTERS[adapter], tmp_path / "run"
    train = ["train", "--model", name, *RANDOM, "--reward", "jpeg-compressibility", "--prompts", prompts]
    r = run(*train, *small(prompts), "--iterations", 2, "--run-dir", run_dir)
    assert r.exit_code == 0, r.output
    head = r.stderr.splitlines()[0]
    assert f"model {name} (random weights, tiny size)" in head and "jpeg-compressibility" in head, head
    info = json.loads((run_dir / "run.json").read_text())
    assert info["device"] == "cpu"
    assert info["model"]["weights"] == "random (tiny size)" and info["model"]["adapter"] == adapter
    assert "no download" in info["model"]["source"]

    r = run("train", "--resume", run_dir, "--iterations", 3)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2]

    r = run("export", run_dir, "--out", tmp_path / "export")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "export" / "pytorch_lora_weights.safetensors").is_file()
    said = r.stderr.splitlines()  # export says what it does, stage by stage, before its summary
    assert said[0] == f"reading {run_dir / 'checkpoints' / 'step-3'}", said
    assert said[1].startswith(f"loading {name} on cpu") and said[2].startswith("writing the "), said
    assert "LoRA weights of step 3 to" in said[2] and said[3].startswith("exported the "), said

    ev = ["eval", "--checkpoint", run_dir, "--metric", "jpeg-compressibility", "--prompts", prompts, "--json"]
    r = run(*ev, "--steps", 4)
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["metrics"]["jpeg-compressibility"]["n"] == 2


def test_random_weights_and_embeddings_repeat_and_tell_prompts_apart():
    spec = releases.release("flux-dev")
    a = releases.random_module(spec.transformer, spec.tiny, "cpu", torch.float32, seed=0)
    b = releases.random_module(spec.transformer, spec.tiny, "cpu", torch.float32, seed=0)
    c = releases.random_module(spec.transformer, spec.tiny, "cpu", torch.float32, seed=1)
    for (k, p), q, o in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), k
        if p.dim() >= 2:
            assert not torch.equal(p, o), k
            # N(0, 1/fan_in): a unit input keeps about unit scale through the layer
            assert 0.5 < float(p.detach().float().std() * p[0].numel() ** 0.5) < 1.5, k
    text = releases.RandomText(releases.text_shapes(spec, tiny=False, tokens=None))
    one, again, other = text(["a cat"]), text(["a cat"]), text(["a dog"])
    assert one["prompt_embeds"].shape == (1, 512, 4096) and one["pooled"].shape == (1, 768)  # T5-XXL, CLIP-L
    assert torch.equal(one["prompt_embeds"], again["prompt_embeds"])
    assert not torch.equal(one["prompt_embeds"], other["prompt_embeds"])


def test_the_text_shapes_are_the_encoders_real_ones():
    shapes = {name: releases.text_shapes(releases.release(name), tiny=False, tokens=None) for name in ADAPTERS.values()}
    assert shapes["sd3.5-medium"] == {"prompt_embeds": (77 + 256, 4096), "pooled": (2048,)}  # 2 CLIPs + T5
    assert shapes["sd1.5"] == {"prompt_embeds": (77, 768)}  # CLIP-L
    assert shapes["qwen-image"]["prompt_embeds"][1] == 3584  # Qwen2.5-VL-7B's width
    assert shapes["flux2-klein-4b"]["prompt_embeds"][1] == 3 * 2560  # three Qwen3-4B layers
    assert shapes["wan2.1-t2v-1.3b"] == {"prompt_embeds": (226, 4096)}  # UMT5-XXL
    sd3 = releases.text_shapes(releases.release("sd3.5-medium"), tiny=False, tokens=128)
    assert sd3["prompt_embeds"] == (77 + 128, 4096)  # policy.max_sequence_length counts the T5 tokens


@pytest.mark.parametrize(
    "sets, needles",
    [
        (['policy.weights="random"'], ["'tiny-shapes' is none of", "flux-dev"]),
        (['model="flux-dev"', 'policy.size="tiny"'], ['needs policy.weights = "random"']),
        (['model="flux-dev"', 'policy.weights="randon"'], ["policy.weights must be one of pretrained, random"]),
        (['model="flux-dev"', 'policy.weights="random"', 'policy.size="small"'], ["policy.size must be one of"]),
        (['model="wan2.1-i2v-14b-480p"', 'policy.weights="random"'], ["image-to-video", "image encoder"]),
    ],
)
def test_bad_random_weight_settings_are_one_line(sets, needles, tmp_path):
    args = [a for s in sets for a in ("--set", s)]
    one_line_error(run("train", *args, "--iterations", 1, "--run-dir", tmp_path / "r"), *needles)
    assert not (tmp_path / "r").exists()
