"""The diffusers adapters declare their details in their own files (models/catalog.py cards, read from the source;
each file's RELEASES and TINY_PIPELINES) and everything else is derived: the hub and registry tables, the config
defaults, the CLI's help, the random-weight releases. A new adapter is one file: every check here reads the
adapters it finds (tests/test_extension_points.py runs them on a package with a throwaway one added). And the one
guided forward of the diffusers base: classifier-free guidance's batch doubling and combine, by hand."""

import importlib
import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch

import treegrpo_cli
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.models import catalog, hub, registry, releases
from treegrpo_cli.models.base import PolicyConfig
from treegrpo_cli.models.catalog import AdapterCard, Entry, read_cards
from treegrpo_cli.models.diffusers_base import DiffusersPolicy

PACKAGE = Path(treegrpo_cli.__file__).resolve().parent  # the package imported (a copy under test, or the checkout)


def adapter_classes() -> dict[type, str]:
    """Every concrete DiffusersPolicy subclass defined in a models/ module, by import (not by the catalog), in
    file and line order."""
    found = {}
    for path in sorted((PACKAGE / "models").glob("*.py")):
        module = importlib.import_module(f"treegrpo_cli.models.{path.stem}")
        classes = [o for o in vars(module).values() if inspect.isclass(o) and o.__module__ == module.__name__]
        for obj in sorted(classes, key=lambda c: inspect.getsourcelines(c)[1]):
            if issubclass(obj, DiffusersPolicy) and not inspect.isabstract(obj):
                found[obj] = path.stem
    return found


def test_every_adapter_class_declares_its_own_card_as_the_catalog_reads_it():
    classes = adapter_classes()
    assert {"flux", "flux2", "qwenimage", "sd", "sd3", "wan", "wan-i2v"} <= {c.card.name for c in classes}
    for cls, module in classes.items():
        assert "card" in cls.__dict__, f"{cls.__name__} inherits its card"
        assert catalog.entries()[cls.card.name] == Entry(module, cls.__name__, cls.card)
        assert "model_output" not in cls.__dict__, f"{cls.__name__} writes its own guided forward"
    assert list(catalog.entries()) == [c.card.name for c in classes]  # the files' order, then the classes'


def test_the_tables_are_the_cards():
    cards = [c.card for c in adapter_classes()]
    assert hub.KNOWN == {r: (h, c.name) for c in cards for r, h in c.releases.items()}
    assert len(hub.KNOWN) == sum(len(c.releases) for c in cards)  # no release served twice
    assert hub.PIPELINES == {p: c.name for c in cards for p in c.pipelines}
    assert len(hub.PIPELINES) == sum(len(c.pipelines) for c in cards)
    assert hub.RELEASE_DEFAULTS == {c.releases[r]: v for c in cards for r, v in c.release_defaults.items()}
    assert hub.GATED == {c.releases[r] for c in cards for r in c.gated}
    assert catalog.families() == list(dict.fromkeys(c.family for c in cards))
    assert registry.ADAPTERS == {e.card.name: (e.module, e.cls) for e in catalog.entries().values()}
    assert all(registry.adapter_class(c.name).card is c for c in cards)
    # spot checks of what the cards say
    assert hub.KNOWN["sd3.5-large"] == ("stabilityai/stable-diffusion-3.5-large", "sd3")
    assert hub.KNOWN["wan2.1-i2v-14b-720p"] == ("Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", "wan-i2v")
    assert hub.PIPELINES["Flux2KleinPipeline"] == "flux2" and hub.PIPELINES["WanImageToVideoPipeline"] == "wan-i2v"
    assert hub.RELEASE_DEFAULTS["stabilityai/stable-diffusion-3.5-large"] == {"policy.guidance": 3.5}
    assert registry.ADAPTERS["wan-i2v"] == ("wan", "WanI2VPolicy")


def test_every_release_has_its_configs_in_its_adapters_file():
    """Each adapter file's RELEASES holds configs for the releases its cards serve, and every release has one:
    random weights, the memory estimate and docs/models.md's tables build on them."""
    for module in dict.fromkeys(e.module for e in catalog.entries().values()):
        specs = importlib.import_module(f"treegrpo_cli.models.{module}").RELEASES
        served = {r for e in catalog.entries().values() if e.module == module for r in e.card.releases}
        assert set(specs) <= served, f"models/{module}.py: configs of releases no card of its serves"
        assert all(isinstance(s, releases.ReleaseSpec) for s in specs.values())
    assert list(releases.releases()) == list(hub.KNOWN)
    klein = releases.release("flux2-klein-4b")
    assert (klein.hub_id, klein.adapter, klein.pipeline) == (
        "black-forest-labs/FLUX.2-klein-4B",
        "flux2",
        "Flux2KleinPipeline",
    )


def test_every_adapter_file_has_a_tiny_pipeline():
    from tinypipes import TINY

    for e in catalog.entries().values():
        assert importlib.import_module(f"treegrpo_cli.models.{e.module}").TINY_PIPELINES, e.module
    assert {"flux", "sd3", "sd", "qwenimage", "flux2-dev", "wan", "wan-i2v"} <= set(TINY)


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


def test_each_adapters_defaults_without_its_files(no_cache):
    big = {"rollout.max_batch": 8, "policy.gradient_checkpointing": True}
    assert registry.model_defaults("flux-dev") == big
    assert registry.model_defaults("qwen-image") == {**big, "sampler.grid": "model"}
    assert registry.model_defaults("flux2-klein-4b") == {**big, "sampler.grid": "model"}
    sd3 = {**big, "sampler.grid": "flow-match-euler", "sampler.shift": 3.0, "sampler.num_train_timesteps": 1000}
    assert registry.model_defaults("sd3.5-medium") == sd3
    assert registry.model_defaults("sd3.5-large") == {**sd3, "policy.guidance": 3.5}
    assert registry.model_defaults("sd1.5") == {"rollout.max_batch": 16}
    wan = {"rollout.max_batch": 4, "policy.gradient_checkpointing": True, "sampler.shift": 3.0}
    assert registry.model_defaults("wan2.1-t2v-1.3b") == wan
    assert registry.model_defaults("wan2.1-i2v-14b-720p") == {**wan, "policy.resolution": 720}
    assert registry.model_defaults("org/not-cached") == {}


def folder(tmp_path: Path, pipeline: str, scheduler: dict) -> str:
    (tmp_path / "scheduler").mkdir(parents=True)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("pipeline", "scheduler", "expected"),
    [
        ("WanPipeline", {"flow_shift": 5.0, "shift": 1.0}, {"sampler.shift": 5.0}),  # UniPC's flow_shift first
        ("WanPipeline", {"shift": 2.0}, {"sampler.shift": 2.0}),
        ("WanPipeline", {}, {"sampler.shift": 3.0}),
        ("StableDiffusion3Pipeline", {"shift": 2.5}, {"sampler.shift": 2.5, "sampler.num_train_timesteps": 1000}),
        ("StableDiffusion3Pipeline", {"num_train_timesteps": 500}, {"sampler.num_train_timesteps": 500}),
    ],
)
def test_a_folders_scheduler_sets_the_cards_scheduler_settings(tmp_path, pipeline, scheduler, expected):
    got = hub.adapter_defaults(folder(tmp_path, pipeline, scheduler))
    assert {k: got[k] for k in expected} == expected
    assert isinstance(got.get("sampler.num_train_timesteps", 0), int)


@pytest.mark.parametrize(
    ("pipeline", "scheduler", "needle"),
    [
        ("WanPipeline", {"flow_shift": 5.0, "shift": -1}, "shift must be a positive number"),
        ("StableDiffusion3Pipeline", {"num_train_timesteps": 2.5}, "must be a positive whole number"),
    ],
)
def test_a_bad_scheduler_value_is_one_line(tmp_path, pipeline, scheduler, needle):
    with pytest.raises(TreegrpoError, match=needle):
        hub.adapter_defaults(folder(tmp_path, pipeline, scheduler))


def test_the_cli_help_names_the_cards_models():
    from clitools import run

    from treegrpo_cli.cli.common import MODEL_PANEL, model_help

    assert MODEL_PANEL == f"Model (diffusers: {', '.join(catalog.families())})"
    assert {"FLUX.1", "FLUX.2", "Qwen-Image", "SD1.5", "SD3.5", "Wan2.1"} <= set(catalog.families())
    assert all(name in model_help("x") for name in hub.KNOWN)
    r = run("train", "--help")
    said = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 0 and ", ".join(catalog.families()) in said and "qwen-image" in said


@pytest.mark.parametrize(
    ("card", "needle"),
    [
        (
            'card = AdapterCard(name="x", family=FAMILY, pipelines=())',
            "zz.py:2: AdapterCard's family must be a literal",
        ),
        ('card = AdapterCard(name="x", family="X", pipelines=(), defaults=dict(a=1))', "not `dict\\(a=1\\)`"),
        ('card = AdapterCard("x", "X", ())', "zz.py:2: AdapterCard takes keyword arguments only"),
        ('card = AdapterCard(name="flux", family="X", pipelines=())', "adapter 'flux' is declared twice"),
        ('card = AdapterCard(name="x", family="X", pipelines=(), releases={"flux-dev": "a/b"})', "served by 'flux'"),
        ('card = AdapterCard(name="x", family="X", pipelines=(), colour="red")', "unexpected keyword argument"),
        ('card = AdapterCard(name="x", family="X", pipelines=(), gated=("x-1",))', "x-1 gated .* not a release"),
    ],
)
def test_a_card_that_cannot_be_read_is_one_error_naming_its_file(tmp_path, card, needle):
    """Cards are read from the parsed source (ast, no import, no pattern matching): a value that is not a literal
    or a card that does not fit is a programming error naming the file and line."""
    shutil.copy(PACKAGE / "models" / "flux.py", tmp_path / "flux.py")
    (tmp_path / "zz.py").write_text(f"class Z:\n    {card}\n")
    with pytest.raises(ValueError, match=needle):
        read_cards(tmp_path)


def test_a_card_outside_a_class_body_is_refused_and_other_calls_are_not_cards(tmp_path):
    (tmp_path / "a.py").write_text('card = AdapterCard(name="x", family="X", pipelines=())\n')
    with pytest.raises(ValueError, match="a.py:1: an AdapterCard belongs in an adapter's class body"):
        read_cards(tmp_path)
    (tmp_path / "a.py").write_text('def f():\n    return AdapterCard(name="x", family="X", pipelines=())\n')
    assert read_cards(tmp_path) == {}


# -- the guided forward ---------------------------------------------------------------------------


class Guided(DiffusersPolicy):
    """A DiffusersPolicy without a pipeline: denoise(x) = x (1 + e) * image, e the prompt's number and image a
    condition the negative prompt lacks (as an image-to-video first frame); the negative prompt's e is 0."""

    card = AdapterCard(name="guided-test", family="Test", pipelines=())

    def __init__(self, guidance: float, uses_negative: bool = True, cfg_uncond: str = "grad"):  # no pipeline
        self.opts, self.guidance, self.uses_negative = PolicyConfig(cfg_uncond=cfg_uncond), guidance, uses_negative
        self.device, self.calls = torch.device("cpu"), []
        self._cache = {"": {"e": torch.zeros(1, 1)}}

    def denoise(self, net, x, sigma, cond):
        self.calls.append(x.shape[0])
        return x * (1 + cond["e"]) * cond["image"]

    def _encode_text(self, prompts):
        raise NotImplementedError

    def _latent_shape(self):
        raise NotImplementedError

    def _vae_in(self, latents):
        raise NotImplementedError


def guided(policy: Guided) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[2.0], [1.0]], requires_grad=True)
    cond = {"e": torch.tensor([[1.0], [2.0]]), "image": torch.tensor([[1.0], [10.0]])}
    out = policy.model_output(None, x, torch.tensor([0.5, 0.5]), cond)
    (grad,) = torch.autograd.grad(out.sum(), x)
    return out.detach(), grad


def test_classifier_free_guidance_doubles_the_batch_once_and_combines_by_hand():
    """w = 3: c = x (1 + e) img = [4, 30], u = x img = [2, 10], u + 3 (c - u) = [8, 70]; d/dx = img (1 + 3e) =
    [4, 70]. The negative prompt's rows reuse the first frame (img) they have none of."""
    policy = Guided(3.0)
    out, grad = guided(policy)
    assert policy.calls == [4] and policy.evals_per_row == 2
    assert out.tolist() == [[8.0], [70.0]] and grad.tolist() == [[4.0], [70.0]]


def test_detached_unconditional_half_and_no_guidance():
    """cfg_uncond = "detach": d/dx = 3 (1 + e) img = [6, 90]. Guidance 1 or no negative prompt (a distilled
    model): one forward of the B rows, the conditional prediction c = [4, 30]."""
    out, grad = guided(Guided(3.0, cfg_uncond="detach"))
    assert out.tolist() == [[8.0], [70.0]] and grad.tolist() == [[6.0], [90.0]]
    for policy in (Guided(1.0), Guided(3.0, uses_negative=False)):
        out, grad = guided(policy)
        assert policy.calls == [2] and policy.evals_per_row == 1
        assert out.tolist() == [[4.0], [30.0]] and grad.tolist() == [[2.0], [30.0]]
