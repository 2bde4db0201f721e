"""bench/gpu_check.py --variants on the CPU (--tiny): each speed candidate as its own flux_iteration.py process,
its speed-up over base, a candidate that cannot run here recorded as such, an unknown one refused."""

import json

import pytest
from benchmods import load


def _check():
    return load("gpu_check")


@pytest.mark.slow
def test_variants_against_base_in_one_call(tmp_path, capsys):
    check, out = _check(), tmp_path / "v.json"
    argv = ["--tiny", "--variants", "base,cudnn,batch16", "--preset", "tree-grpo-mean", "--prompts", "1"]
    assert check.main([*argv, "--iterations", "1", "--budget", "600", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = {r["variant"]: r for r in res["variants"]}
    assert list(rows) == ["base", "cudnn", "batch16"] and res["mfu"] == [] and res["green"]
    assert [s["step"] for s in res["steps"]] == [f"variant {v}: flux-dev, tree-grpo-mean" for v in rows]
    assert rows["base"]["rollout_speedup"] == 1.0 and rows["base"]["train_speedup"] == 1.0
    b, v = rows["base"], rows["batch16"]
    assert (
        v["rollout_speedup"] == round(b["rollout_s"] / v["rollout_s"], 3) and v["trained_edges"] == b["trained_edges"]
    )
    # cuDNN's attention is a CUDA kernel: on the CPU the case fails inside the script, and says so
    assert rows["cudnn"]["status"] == "case error" and "rollout_speedup" not in rows["cudnn"]
    assert "case error" in capsys.readouterr().out


def test_an_unknown_variant_is_refused(capsys):
    assert _check().main(["--tiny", "--variants", "base,warp-speed"]) == 2
    assert "unknown --variants warp-speed" in capsys.readouterr().err
