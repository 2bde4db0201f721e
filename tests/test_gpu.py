"""On a GPU machine (`pytest -m gpu`; skipped where torch sees no CUDA device): the default device is the GPU and a
run there repeats itself, as on the CPU."""

import json

import pytest
from clitools import PIXEL, run

pytestmark = pytest.mark.gpu

SMALL = [*PIXEL, "--set", "train.eval_samples=1", "--set", "train.sample_every=0", "--iterations", 2]


def test_auto_trains_on_the_gpu_and_repeats(tmp_path):
    rows = []
    for name in ("a", "b"):
        r = run("train", *SMALL, "--run-dir", tmp_path / name)
        assert r.exit_code == 0, r.output
        assert json.loads((tmp_path / name / "run.json").read_text())["device"] == "cuda:0"
        rows.append([json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    a, b = ([r["reward_mean"] for r in run_rows] for run_rows in rows)
    assert a[0] == b[0]  # the first rollout, before any update: the same noises, the same forwards
    assert abs(a[1] - b[1]) < 1e-3  # after an update (CUDA's backward kernels may sum in another order)
    assert all(r["peak_mib"] > 0 for r in rows[0])
