"""Generated damaged input for every reader of user and run files: config keys, TOML files, prompt files,
index.json, run.json and metrics rows. Each reader either accepts the input or raises the one-line
TreegrpoError (printed as one line and a non-zero exit by the CLI); no other exception, and the input on
disk is unchanged. 500 examples a reader."""

import json
import math
from pathlib import Path

import pytest
from clitools import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treegrpo_cli.config import Config, load_config
from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.report.tree_report import inspect_trees
from treegrpo_cli.store.shards import FORMAT, VERSION
from treegrpo_cli.training import rundir, runlog

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out

SETTINGS = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same examples every run
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _keys() -> list[str]:
    def flat(d: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in d.items():
            out += flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
        return out

    return flat(Config().to_dict())


def toml_value(v) -> str:
    """A value as --set takes it (TOML): strings quoted, floats as TOML spells nan and inf."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v) if v is not None else '"none"'


def accepts_or_refuses(read, *args):
    try:
        read(*args)
    except TreegrpoError as e:
        assert str(e).strip() and "\n" not in str(e).strip(), repr(str(e))


@SETTINGS
@given(key=st.sampled_from(_keys()), value=json_values)
def test_any_value_for_any_config_key(key, value):
    accepts_or_refuses(load_config, None, None, [f"{key}={toml_value(value)}"])


@SETTINGS
@given(raw=st.text(max_size=40))
def test_any_text_after_a_config_key(raw):
    accepts_or_refuses(load_config, None, None, [f"sampler.steps={raw}"])
    accepts_or_refuses(load_config, None, None, [raw])


@SETTINGS
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_toml_file(tmp_path, data):
    path = tmp_path / "c.toml"
    path.write_bytes(data)
    accepts_or_refuses(load_config, None, path, [])
    assert path.read_bytes() == data


@SETTINGS
@given(
    data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode),
    suffix=st.sampled_from([".txt", ".jsonl", ".json"]),
)
def test_any_prompt_file(tmp_path, data, suffix):
    path = tmp_path / f"p{suffix}"
    path.write_bytes(data)
    accepts_or_refuses(load_prompts, path)
    assert path.read_bytes() == data


GOOD_ENTRY = {"file": "trees-0.safetensors", "sha256": "0" * 64, "bytes": 10, "role": "trees"}


def good_index() -> dict:
    return {"format": FORMAT, "version": VERSION, "kind": "trees", "meta": {}, "shards": {"trees-0": dict(GOOD_ENTRY)}}


@SETTINGS
@given(
    index=json_values,
    field=st.sampled_from(["format", "version", "kind", "meta", "shards", "file", "sha256", "bytes", "role"]),
    value=json_values,
)
def test_any_index_json(tmp_path, index, field, value):
    """Wholly random, and a good index with one field replaced (on the header or on a shard entry), opened as a
    tree folder and read as `inspect` reads it (its shard file holds junk bytes)."""
    folder = tmp_path / "trees"
    folder.mkdir(exist_ok=True)
    (folder / "trees-0.safetensors").write_bytes(b"0123456789")
    good = good_index()
    if field in GOOD_ENTRY:
        good["shards"]["trees-0"][field] = value
    else:
        good[field] = value
    for content in (index, good):
        (folder / "index.json").write_text(json.dumps(content))
        before = snapshot(tmp_path)
        accepts_or_refuses(inspect_trees, folder)
        assert snapshot(tmp_path) == before


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    if not run.exists():
        run.mkdir()
        cfg = load_config(None, None, ['model="pixel-tiny"'])
        rundir.create(run, cfg, "treegrpo train", {"train": ["a"], "eval": ["b"]})
    return run


@SETTINGS
@given(
    field=st.sampled_from(["format", "version", "config", "prompts", "command", "created", "treegrpo"]),
    value=json_values,
)
def test_any_run_json_field(tmp_path, field, value):
    run = _run(tmp_path)
    info = json.loads((run / "run.json").read_text())
    info[field] = value
    (run / "run.json").write_text(json.dumps(info))
    before = snapshot(run)
    accepts_or_refuses(rundir.read_info, run)
    accepts_or_refuses(rundir.load_config, run)
    assert snapshot(run) == before


@SETTINGS
@given(
    rows=st.lists(
        st.dictionaries(
            st.sampled_from(["iteration", "wall", "reward_mean", "seconds", "flops_total", "optimizer_steps", "x"]),
            json_values,
            max_size=4,
        ),
        max_size=4,
    ),
    torn=st.booleans(),
)
def test_any_metrics_rows(tmp_path, rows, torn):
    run = _run(tmp_path)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run / "metrics.jsonl").write_text(text[:-1] if torn and text else text)
    (run / "eval.jsonl").write_text(text)
    before = snapshot(run)
    accepts_or_refuses(runlog.read_metrics, run)
    accepts_or_refuses(runlog.read_evals, run)
    assert snapshot(run) == before


def test_the_readers_are_exercised():
    """A few fixed cases: the strategies reach both outcomes of each reader."""
    with pytest.raises(TreegrpoError):
        load_config(None, None, ["sampler.steps=-1"])
    assert load_config(None, None, ["sampler.steps=12"]).sampler.steps == 12
