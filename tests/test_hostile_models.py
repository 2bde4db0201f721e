"""Crafted model folders and failing trackers: every field the tool reads from a model folder is checked with
one line; a tracker that cannot start or fails mid-run is dropped with one warning and the run goes on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from clitools import one_line_error, run

SD3 = ["diffusers", "SD3Transformer2DModel"]
FAST = [
    "--set",
    'model="pixel-tiny"',
    "--set",
    "rollout.num_prompts=2",
    "--set",
    "train.eval_samples=0",
    "--set",
    "train.sample_every=0",
]


def model_folder(tmp_path: Path, index: object, scheduler: str | None = None) -> Path:
    folder = tmp_path / "m"
    (folder / "scheduler").mkdir(parents=True)
    (folder / "model_index.json").write_text(index if isinstance(index, str) else json.dumps(index))
    if scheduler is not None:
        (folder / "scheduler" / "scheduler_config.json").write_text(scheduler)
    return folder


@pytest.mark.parametrize(
    "index, scheduler, needles",
    [
        ([], None, ["model_index.json", "must be an object"]),
        ("[" * 100_000, None, ["model_index.json", "not valid JSON", "nested deeper"]),
        ({"_class_name": ["StableDiffusion3Pipeline"]}, None, ["_class_name must be a string"]),
        ({"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers"]}, None, ["transformer must be"]),
        ({"_class_name": "StableDiffusion3Pipeline", "transformer": [1, 2]}, None, ["transformer must be"]),
        ({"_class_name": "StableDiffusion3Pipeline", "transformer": SD3}, '{"shift": "abc"}', ["shift", "'abc'"]),
        (
            {"_class_name": "StableDiffusion3Pipeline", "transformer": SD3},
            '{"num_train_timesteps": Infinity}',
            ["num_train_timesteps", "whole number", "inf"],
        ),
        (
            {"_class_name": "StableDiffusion3Pipeline", "transformer": SD3},
            '{"num_train_timesteps": 1000.5}',
            ["num_train_timesteps", "whole number"],
        ),
        ({"_class_name": "WanPipeline", "transformer": SD3}, '{"flow_shift": -1}', ["flow_shift", "positive"]),
    ],
)
def test_a_crafted_model_folder_is_one_line(tmp_path, index, scheduler, needles):
    folder = model_folder(tmp_path, index, scheduler)
    r = run("rollout", "--model", folder, "-n", 1, "--out", tmp_path / "out")
    one_line_error(r, *needles)
    assert "this is a bug" not in r.stderr and not (tmp_path / "out").exists()


def test_a_model_folder_with_a_pickle_is_refused_without_library_warnings(tmp_path, monkeypatch, recwarn):
    import warnings

    from treegrpo_cli.errors import TreegrpoError
    from treegrpo_cli.models import diffusers_base

    class Pipeline:
        __name__ = "StableDiffusion3Pipeline"

        @classmethod
        def from_pretrained(cls, *a, **kw):
            warnings.warn("torch.load with weights_only=False is unsafe", FutureWarning, stacklevel=1)
            raise OSError("refusing to unpickle transformer/diffusion_pytorch_model.bin")

    Pipeline.__name__ = "StableDiffusion3Pipeline"
    monkeypatch.setattr(diffusers_base, "quiet_diffusers", lambda: None)
    with pytest.raises(TreegrpoError, match="could not load the StableDiffusion3Pipeline"):
        diffusers_base.load_pipeline(tmp_path, Pipeline, None)
    assert not [w for w in recwarn if "unsafe" in str(w.message)]


# --- trackers ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tensorboard_folder_it_cannot_write_drops_the_tracker_with_one_warning(tmp_path):
    pytest.importorskip("tensorboard")
    folder = tmp_path / "r"
    assert run("train", *FAST, "--iterations", 1, "--run-dir", folder).exit_code == 0
    (folder / "tensorboard").write_text("a file where the tracker's folder goes")
    r = run("train", "--resume", folder, "--iterations", 2, "--log", "tensorboard")
    assert r.exit_code == 0, r.output
    warns = [ln for ln in r.stderr.splitlines() if "train.log tensorboard" in ln]
    assert len(warns) == 1 and "goes on without it" in warns[0], r.stderr
    assert "Traceback" not in r.output and "Exception in thread" not in r.output
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_tensorboard_install_that_does_not_import_drops_the_tracker(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import` raises ImportError
    r = run("train", *FAST, "--iterations", 1, "--log", "tensorboard", "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "train.log tensorboard could not start (ModuleNotFoundError" in r.stderr and "this is a bug" not in r.stderr


@pytest.mark.slow
def test_a_tracker_that_fails_mid_run_is_dropped_and_the_run_finishes(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from treegrpo_cli.training import tracking

    def broken(self, values, step):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking._TensorBoard, "scalars", broken)
    r = run("train", *FAST, "--iterations", 2, "--log", "tensorboard", "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    warns = [ln for ln in r.stderr.splitlines() if "train.log tensorboard failed" in ln]
    assert len(warns) == 1 and "No space left" in warns[0]
