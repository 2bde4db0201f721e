"""bench/flux_iteration.py on the CPU: its tiny mode, its refusal without a GPU, each release's tiny shape."""

import json

import pytest
import torch
from benchmods import load


@pytest.mark.slow
def test_bench_tiny_mode_and_cpu_refusal(tmp_path, capsys):
    bench = load("flux_iteration")
    if not torch.cuda.is_available():
        assert bench.main(["--out", str(tmp_path / "gpu.json")]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err and not (tmp_path / "gpu.json").exists()
    out = tmp_path / "tiny.json"
    assert bench.main(["--tiny", "--presets", "branch", "--iterations", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [(c["preset"], c["mode"]) for c in res["results"]] == [("branch", "lora"), ("branch", "full")]
    for case in res["results"]:
        it = case["iterations"][0]
        assert it["rollout_evals"] == 203 and it["leaves"] == 16 and it["ratio_first_dev"] < 1e-5
        assert it["rollout_s"] > 0 and it["train_s"] > 0
    lora, full = res["results"]
    assert lora["trainable_params"] < lora["total_params"] and full["trainable_params"] == full["total_params"]
    it = full["iterations"][0]
    assert it["forward_gflops"] > 0 and it["rollout_mfu"] is None  # no peak known for a CPU
    f, b = it["forward_gflops"], it["backward_gflops"]  # full fine-tuning: the weight gradients too, so b > f
    assert (
        b > f
        and abs(it["train_tflops"] / it["rollout_tflops"] - it["train_evals"] * (f + b) / (it["rollout_evals"] * f))
        < 1e-9
    )


def _bench():
    return load("flux_iteration")


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", ["sd3.5-large", "qwen-image", "flux2-dev", "flux2-klein-4b", "flux2-klein-base-9b", "wan2.1-t2v-1.3b"]
)
def test_bench_runs_each_model_tiny(tmp_path, model):
    """flux_iteration.py --model NAME: the release's architecture at tiny sizes through its adapter; true CFG doubles
    the network rows; the model FLOPs are the adapter's formula without checkpointing's recomputation."""
    bench = _bench()
    out = tmp_path / "tiny.json"
    assert bench.main(["--tiny", "--model", model, "--presets", "branch", "--modes", "lora", "--iterations", "1",
                       "--out", str(out)]) == 0  # fmt: skip
    res = json.loads(out.read_text())
    assert res["model"] == model and res["hub_id"] == bench.MODELS[model].hub_id
    it = res["results"][0]["iterations"][0]
    cfg = model in ("sd3.5-large", "qwen-image", "flux2-klein-base-9b", "wan2.1-t2v-1.3b")  # true CFG
    assert it["rollout_evals"] == 203 * (2 if cfg else 1) and it["leaves"] == 16
    assert it["forward_gflops"] > 0 and it["train_tflops"] > 0
