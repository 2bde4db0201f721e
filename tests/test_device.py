"""--device auto: the GPU a user has (each process of a distributed run on its own), else the CPU; the device a run
computes on is printed first and recorded in run.json."""

import json

import pytest
import torch
from clitools import run

from treegrpo_cli.preflight import resolve_device
from treegrpo_cli.training.run import device_notes

COMPUTING = ("train", "rollout", "score", "eval", "diversity", "export", "serve-reward")


@pytest.mark.slow
@pytest.mark.parametrize("command", COMPUTING)
def test_every_computing_command_defaults_to_auto(command):
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.replace("│", " ").split())  # the help's panels wrap text between borders
    assert "auto (a GPU when torch sees one" in flat
    assert "[default: auto]" in flat


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_auto_is_the_first_gpu_of_one_process(four_gpus):
    assert resolve_device("auto") == "cuda:0"


def test_auto_is_the_process_own_gpu_under_torchrun(four_gpus):
    four_gpus.setenv("LOCAL_RANK", "2")
    four_gpus.setenv("RANK", "6")  # the second node's third process
    four_gpus.setenv("WORLD_SIZE", "8")
    assert resolve_device("auto") == "cuda:2"
    assert resolve_device("cuda") == "cuda:2"  # a bare cuda under a launcher is the process's own GPU too
    assert resolve_device("cuda:1") == "cuda:1"  # an explicit index is kept


def test_auto_refuses_a_local_rank_beyond_the_gpus(four_gpus):
    from treegrpo_cli.errors import TreegrpoError

    four_gpus.setenv("LOCAL_RANK", "5")
    with pytest.raises(TreegrpoError, match="only 4 CUDA device"):
        resolve_device("auto")


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


def test_explicit_cuda_without_a_gpu_is_one_line(monkeypatch):
    from clitools import one_line_error

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_line_error(run("train", "--device", "cuda", "--iterations", "1"), "--device cuda", "no CUDA device")


def test_a_released_model_on_the_cpu_is_warned_about():
    notes = device_notes("cpu", "flux-dev", "random", "full")
    assert notes[0].startswith("device: cpu")
    assert any("11.9 billion" in n and "--device cuda" in n and 'policy.size="tiny"' in n for n in notes)
    assert len(device_notes("cpu", "flux-dev", "random", "tiny")) == 1  # the tiny build is CPU-sized
    assert len(device_notes("cuda:0", "flux-dev")) == 1
    assert len(device_notes("cpu", "tiny-shapes")) == 1


def test_a_run_prints_and_records_its_device(tmp_path):
    result = run(
        "train",
        "--model",
        "pixel-tiny",
        "--iterations",
        "1",
        "--run-dir",
        tmp_path / "r",
        "--set",
        "train.eval_samples=0",
    )
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[:3]
    assert first[0].startswith("starting ") and "model pixel-tiny" in first[0]
    assert first[1] == "device: cpu (no GPU seen by torch)"
    assert first[2] == f"run folder: {tmp_path / 'r'}"
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["device"] == "cpu"
    assert info["model"]["name"] == "pixel-tiny"
