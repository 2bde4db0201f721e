"""Small user-reported problems: `presets` at 80 columns, `inspect` of a run folder, `export --dtype`, the
training summary's numbers, reward.png's std band, `config show`'s options and labels, `--prompts` near a
built-in list's name, and comma lists in --set."""

import json

import pytest
from clitools import PIXEL, one_line_error, refused, run

from treegrpo_cli.cli import common
from treegrpo_cli.config import load_config, preset_names


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished two-iteration run of the smallest model, and what `train` printed."""
    folder = tmp_path_factory.mktemp("small-asks") / "run"
    r = run("train", *PIXEL, "--iterations", 2, "--run-dir", folder)
    assert r.exit_code == 0, r.output
    return folder, r.stdout


# 1. presets at 80 columns


@pytest.mark.parametrize("width", [80, 60, 120])
def test_presets_never_cut_a_name_at_a_narrow_width(monkeypatch, width):
    monkeypatch.setattr(common.out, "_width", width)
    r = run("presets")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    first = {line.split()[0].rstrip(":") for line in lines if line.split()}
    assert set(preset_names()) <= first and "…" not in r.stdout, r.stdout  # each name whole, none cut
    assert "description" in r.stdout or width < 80  # the table where it fits; two lines a preset below


# 2. inspect RUN


def test_inspect_of_a_run_folder_summarises_the_run(trained):
    folder, _ = trained
    r = run("inspect", folder)
    assert r.exit_code == 0, r.output
    text = r.stdout
    assert "training run" in text and "tree-grpo-mean" in text and "pixel-tiny" in text
    assert "2 of 2" in text and "step-2" in text and "held-out reward" in text
    assert f"treegrpo compare {folder}" in text and f"treegrpo eval --checkpoint {folder}" in text
    data = json.loads(run("inspect", folder, "--json").stdout)
    assert data["iterations"] == 2 and data["checkpoint_step"] == 2 and data["config"] == "tree-grpo-mean"
    assert data["heldout_after_iteration"] == 2 and isinstance(data["heldout_gain"], float)


def test_inspect_of_a_damaged_run_folder_is_one_line(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    refused(["inspect", tmp_path], ["run.json", "not valid JSON"], tmp_path)
    one_line_error(run("inspect", tmp_path / "none"), "no such")


# 3. export --dtype


def test_export_passes_dtype_to_the_model_it_loads(trained, tmp_path, monkeypatch):
    from treegrpo_cli.errors import TreegrpoError
    from treegrpo_cli.training import export

    seen = []

    def load_policy(model, device, opts, text_encoders=True):
        seen.append(opts.dtype)
        raise TreegrpoError("stopped after the load (test)")

    monkeypatch.setattr(export, "load_policy", load_policy)
    folder, _ = trained
    for given, want in ([], "auto"), (["--dtype", "bf16"], "bf16"), (["--dtype", "float32"], "fp32"):
        one_line_error(run("export", folder, "--out", tmp_path / "e", "--device", "cpu", *given), "stopped after")
        assert seen[-1] == want
    refused(["export", folder, "--out", tmp_path / "e", "--dtype", "half"], ["--dtype", "auto, bf16, fp32"], folder)
    assert len(seen) == 3  # refused before anything loads


# 4. the training summary


def test_summary_values_keep_their_digits_and_say_durations_readably():
    from treegrpo_cli.cli.train_report import summary_value

    assert summary_value("lr", 3e-05) == "3e-05" and summary_value("approx_kl", 2e-05) == "2e-05"
    assert summary_value("reward_last_tenth", -0.765740692615509) == "-0.7657"
    assert summary_value("minutes", 57 / 60) == "57 s"
    assert summary_value("minutes", 3.2) == "3.2 min"
    assert summary_value("minutes", 65.2) == "1 h 05 min"
    assert summary_value("wall", 0.886) == "0.9 s"
    assert summary_value("seconds", {"rollout": 12.0, "total": 75.0}) == "rollout 12 s, total 1.2 min"
    assert summary_value("iterations", 2) == "2" and summary_value("stopped_early", False) == "False"


def test_the_printed_summary_has_no_rounded_away_numbers_and_json_keeps_numbers(trained, capsys):
    from treegrpo_cli.cli.train_report import report_summary as _report

    _, printed = trained
    assert "0.0000" not in printed and "training time" in printed
    row = next(line for line in printed.splitlines() if "training time" in line)
    assert row.split("│")[2].strip().endswith((" s", " min"))
    summary = {"run_dir": "r", "lr": 3e-05, "approx_kl": 2e-05, "minutes": 57 / 60}
    _report(summary, True)
    assert json.loads(capsys.readouterr().out) == summary  # --json: the numbers as they are
    _report(summary, False)
    text = capsys.readouterr().out
    assert "3e-05" in text and "2e-05" in text and "57 s" in text and "0.0000" not in text


# 5. reward.png's std band


def test_the_reward_band_stays_inside_the_rewards_seen():
    from treegrpo_cli.training.runplots import reward_band

    rows = [
        {"iteration": 0, "reward_mean": 0.95, "reward_std": 0.15, "reward_min": 0.7, "reward_max": 1.0},
        {"iteration": 1, "reward_mean": 0.1, "reward_std": 0.2, "reward_min": 0.0, "reward_max": 0.6},
        {"iteration": 2, "reward_mean": 0.5, "reward_std": 0.1},  # a row written before the extremes were kept
    ]
    low, high = reward_band(rows)
    assert low == pytest.approx([0.8, 0.0, 0.4]) and high == pytest.approx([1.0, 0.3, 0.6])


def test_a_run_keeps_each_iterations_extremes_and_its_band_inside_them(trained):
    from treegrpo_cli.training.runlog import read_metrics
    from treegrpo_cli.training.runplots import reward_band

    rows = read_metrics(trained[0])
    low, high = reward_band(rows)
    for r, lo, hi in zip(rows, low, high, strict=True):
        assert r["reward_min"] <= r["reward_mean"] <= r["reward_max"]
        assert r["reward_min"] <= lo <= hi <= r["reward_max"]


# 6. config show: --model's label, and train's --reward, --prompts, --iterations


def test_config_show_labels_the_options_and_takes_trains_options():
    from treegrpo_cli.cli.train_options import DEFAULT_PRESET

    args = ["--model", "flux-dev", "--reward", "shapes,hps", "--prompts", "shapes-train", "--iterations", 7]
    r = run("config", "show", *args, "--set", "train.lr=3e-5", "--explain")
    assert r.exit_code == 0, r.output
    where = {line.split(" = ")[0]: line.rsplit("# ", 1)[1] for line in r.stdout.splitlines()}
    assert where["model"] == "--model" and where["reward.names"] == "--reward"
    assert where["rollout.prompts"] == "--prompts" and where["train.iterations"] == "--iterations"
    assert where["train.lr"] == "--set"
    shown = json.loads(run("config", "show", *args, "--json").stdout)["config"]
    sets = [
        'model="flux-dev"',
        'reward.names=["shapes", "hps"]',
        "train.iterations=7",
        'rollout.prompts="shapes-train"',
    ]
    assert shown == load_config(DEFAULT_PRESET, sets=sets).to_dict()  # what train with these options runs
    assert shown["reward"]["names"] == ["shapes", "hps"] and shown["train"]["iterations"] == 7


# 7. --prompts near a built-in list's name


def test_prompts_near_a_built_in_list_name_it(tmp_path):
    run_dir = tmp_path / "r"
    refused(
        ["train", *PIXEL, "--prompts", "general", "--run-dir", run_dir], ["did you mean", "'general-train'"], tmp_path
    )
    refused(["train", *PIXEL, "--prompts", "nosuchlist", "--run-dir", run_dir], ["shapes-train"], tmp_path)
    r = refused(["train", *PIXEL, "--prompts", tmp_path / "none.txt", "--run-dir", run_dir], ["not found"], tmp_path)
    assert "built-in" not in r.stderr  # a file's path is not a list's name


# 8. comma lists in --set


def test_a_comma_list_in_set_is_a_list(tmp_path):
    def shown(*sets):
        r = run("config", "show", *[a for s in sets for a in ("--set", s)], "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["config"]

    assert shown("reward.names=shapes,jpeg-compressibility")["reward"]["names"] == ["shapes", "jpeg-compressibility"]
    assert shown("reward.names=[shapes,hps]")["reward"]["names"] == ["shapes", "hps"]  # a shell ate the quotes
    assert shown('reward.names=["shapes", "hps"]')["reward"]["names"] == ["shapes", "hps"]
    assert shown("reward.names=shapes")["reward"]["names"] == ["shapes"]
    assert shown("policy.lora_targets=to_q, to_k")["policy"]["lora_targets"] == ["to_q", "to_k"]
    assert shown("reward.names=shapes,hps", "reward.weights=1,0.5")["reward"]["weights"] == [1.0, 0.5]
    # a reward option's value may hold a comma: one entry, as before
    assert shown("reward.options=shapes.kind=soft,x")["reward"]["options"] == ["shapes.kind=soft,x"]
    one_line_error(
        run("config", "show", "--set", "tree.split_steps=0,x"), "tree.split_steps", "'tree.split_steps=[0, 3]'"
    )

    # each name of the list on its own: the unknown one is named, not the whole item
    args = ["train", *PIXEL, "--set", "reward.names=shapes,jpeg-compresibility", "--run-dir", tmp_path / "r"]
    refused(args, ["unknown reward 'jpeg-compresibility'", "did you mean 'jpeg-compressibility'"], tmp_path)
