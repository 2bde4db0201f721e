"""Data-parallel training with two gloo processes on the CPU: the same weights on both ranks, the same
curve as one process over the same global batch, checkpoints that resume on another process count,
and a failure in one process that stops both with one line."""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from clitools import RUN_HEADER, close, treegrpo

from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import read_evals, read_metrics

SETS = [
    "--set",
    'model="pixel-tiny"',
    "--set",
    "rollout.num_prompts=4",
    "--set",
    "train.save_every=1",
    "--set",
    "train.sample_every=0",
    "--seed",
    "3",
]


def _worker(rank: int, port: int, out: str) -> None:
    """One rank: one training iteration; writes its tree and its weights after the step."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from treegrpo_cli.config import load_config
    from treegrpo_cli.engine import grpo
    from treegrpo_cli.training import dist
    from treegrpo_cli.training import trainer as trainer_module

    d = dist.from_env()
    cfg = load_config("branch", sets=['model="pixel-tiny"', "rollout.num_prompts=4", "seed=5"])
    trainer = trainer_module.Trainer(cfg, "cpu", d)
    seen = {}
    real = grpo.grpo_update

    def spy(policy, opt, sde, batch, *a, **k):
        seen["tree"] = batch.tree
        return real(policy, opt, sde, batch, *a, **k)

    grpo.grpo_update = spy
    trainer.iteration(
        ["a red circle", "two blue squares", "a green triangle", "a big yellow square", "a purple circle"],
        lambda *a: None,
    )
    torch.save(
        {"weights": trainer.policy.trainable_state(), "tree": seen["tree"].tensors()}, Path(out) / f"rank{rank}.pt"
    )
    dist.barrier(d)
    dist.shutdown()


@pytest.mark.slow
def test_one_step_leaves_the_same_weights_on_both_ranks_and_the_trees_of_one_process(tmp_path):
    from treegrpo_cli.cli.launch import free_port
    from treegrpo_cli.config import load_config
    from treegrpo_cli.engine.rollout import rollout
    from treegrpo_cli.training import steps
    from treegrpo_cli.training.trainer import Trainer

    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for k in r0["weights"]:
        assert torch.equal(r0["weights"][k], r1["weights"][k]), k
    cfg = load_config("branch", sets=['model="pixel-tiny"', "rollout.num_prompts=4", "seed=5"])
    trainer = Trainer(cfg, "cpu")
    prompts = ["a red circle", "two blue squares", "a green triangle", "a big yellow square", "a purple circle"]
    plan = steps.plan_iteration(cfg, len(prompts), 0)
    for rank, ids in ((0, plan.prompt_ids[:2]), (1, plan.prompt_ids[2:])):  # each rank's half, rolled out alone
        tree, _ = rollout(trainer.policy, [prompts[i] for i in ids], ids, trainer.sde, plan.tree, plan.seed)
        got = (r0, r1)[rank]["tree"]
        for name, value in tree.tensors().items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, equal_nan=True, msg=name)


@pytest.mark.slow
def test_two_processes_match_one_over_the_same_global_batch_and_resume_on_one(tmp_path):
    """Weights within 1e-6 after 3 iterations of one optimizer step each (the preset's code schedule takes 2
    steps of a node-sum an iteration: Adam then turns the ranks' float-order differences of near-zero
    gradients into steps of about lr; its metrics rows are checked in the test below)."""
    sets = [*SETS, "--set", 'train.loss_norm="mean"', "--set", "train.minibatches=1"]
    one = treegrpo(*sets, "--iterations", 3, "--run-dir", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    two = treegrpo(*sets, "--iterations", 3, "--run-dir", tmp_path / "two", nproc=2)
    assert two.returncode == 0, two.stderr
    close(read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one"))
    a, b = (load_checkpoint(list_checkpoints(tmp_path / d / "checkpoints")[-1]) for d in ("two", "one"))
    for k in b.model:
        torch.testing.assert_close(a.model[k], b.model[k], rtol=1e-4, atol=1e-6)
    part = treegrpo(*sets, "--iterations", 2, "--run-dir", tmp_path / "part", nproc=2)
    assert part.returncode == 0, part.stderr
    more = treegrpo("--resume", tmp_path / "part", "--iterations", 3)  # written by 2, resumed by 1
    assert more.returncode == 0, more.stderr
    close(read_metrics(tmp_path / "part"), read_metrics(tmp_path / "one"))
    assert json.loads((tmp_path / "two" / "run.json").read_text())["config"]["rollout"]["num_prompts"] == 4


@pytest.mark.slow
def test_a_failure_in_one_process_stops_both_with_one_line(tmp_path):
    """Process 1 raises in its second iteration (injected by a sitecustomize on its path only)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    import treegrpo_cli.training.loop as loop\n"
        "    real = loop.Trainer.iteration\n"
        "    def broken(self, *a, **k):\n"
        "        if self.step == 1:\n"
        "            raise RuntimeError('injected failure in process 1')\n"
        "        return real(self, *a, **k)\n"
        "    loop.Trainer.iteration = broken\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    r = treegrpo(*SETS, "--iterations", 4, "--run-dir", tmp_path / "r", nproc=2, timeout=120, env=env)
    assert r.returncode != 0
    progress = ("run folder", "iteration", "eval", "held-out", str(tmp_path))  # a long path wraps onto its own line
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(progress)]
    lines = [ln for ln in lines if not RUN_HEADER.match(ln)]  # the run's first lines
    assert len(lines) == 1 and "injected failure in process 1" in lines[0] and "process 1 of 2" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_the_launcher_reports_a_process_s_own_error_over_the_teardown_noise_after_it():
    """gloo's threads can abort the process after it said its error (std::terminate on the way out)."""
    from types import SimpleNamespace

    from treegrpo_cli.cli.launch import _last_line

    proc = SimpleNamespace(returncode=-6)
    said = "iteration 1\nError: RuntimeError: injected failure\nterminate called without an active exception\n"
    assert _last_line(said, proc) == "RuntimeError: injected failure"
    assert _last_line("Fatal Python error: Aborted\n", proc) == "Fatal Python error: Aborted"
    assert _last_line("\n", proc) == "exit code -6"


@pytest.mark.slow
def test_prompts_that_do_not_split_evenly_are_rounded_up_and_said(tmp_path):
    """A command written for one process runs as it is on two: 3 prompts an iteration become 4, said in the
    run's first lines and kept in its config (a resume on two processes finds them divisible)."""
    r = treegrpo(*SETS, "--set", "rollout.num_prompts=3", "--iterations", 1, "--run-dir", tmp_path / "r", nproc=2)
    assert r.returncode == 0, r.stderr
    assert "rollout.num_prompts 3 -> 4: 2 for each of 2 processes" in r.stderr.splitlines()[2], r.stderr
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["config"]["rollout"]["num_prompts"] == 4
    r = treegrpo("--resume", tmp_path / "r", "--iterations", 2, nproc=2)
    assert r.returncode == 0 and "num_prompts 3 ->" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2])
def test_nproc_is_not_passed_on_to_the_workers(nproc, tmp_path):
    r = treegrpo(*SETS, "--iterations", 1, "--run-dir", tmp_path / "r", f"--nproc-per-node={nproc}")
    assert r.returncode == 0, r.stderr
    assert "--nproc-per-node" not in json.loads((tmp_path / "r" / "run.json").read_text())["command"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["branch-widpru", "flow-grpo", "treepo", "tree-grpo"])
def test_batch_wide_statistics_match_one_process(preset, tmp_path):
    """Width pruning over the whole batch, Flow-GRPO's global std with 2 minibatches, TreePO's global whitening:
    statistics that span both processes' trees."""
    args = [*SETS, "--preset", preset, "--iterations", 2, "--set", "train.eval_samples=0"]
    one = treegrpo(*args, "--run-dir", tmp_path / "one")
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    close(read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one"))


# --- FSDP2 (train.parallel = "fsdp"): the denoiser sharded over the two processes -----------------------

FSDP = ["--set", 'train.parallel="fsdp"']


def _shard_worker(rank: int, port: int, out: str) -> None:
    """One rank of a sharded trainer: what it holds of every weight; after a step, the checkpoint rank 0
    streams to disk (rank 1 takes part in gathering each tensor)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from treegrpo_cli.config import load_config
    from treegrpo_cli.store.checkpoint import follow_checkpoint_gathers, save_checkpoint
    from treegrpo_cli.training import dist
    from treegrpo_cli.training.trainer import Trainer

    d = dist.from_env()
    cfg = load_config(
        "branch",
        sets=['model="pixel-tiny"', "rollout.num_prompts=4", "seed=5", 'train.parallel="fsdp"', "train.ema_decay=0.9"],
    )
    trainer = Trainer(cfg, "cpu", d)
    local = {k: tuple(p.to_local().shape) for k, p in trainer.policy.net.named_parameters()}
    trainer.iteration(["a red circle", "two blue squares", "a green triangle", "a big yellow square"], lambda *a: None)
    ck = trainer.checkpoint({})
    if rank == 0:
        save_checkpoint(Path(out) / "checkpoints", ck, 1, shard_bytes=4096)  # several files, one at a time
    else:
        follow_checkpoint_gathers(ck)
    torch.save(local, Path(out) / f"local{rank}.pt")
    dist.barrier(d)
    dist.shutdown()


@pytest.mark.slow
def test_fsdp_keeps_a_shard_of_every_weight_on_each_rank(tmp_path):
    from treegrpo_cli.cli.launch import free_port

    mp.spawn(_shard_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    l0, l1 = (torch.load(tmp_path / f"local{r}.pt") for r in (0, 1))
    (path,) = list_checkpoints(tmp_path / "checkpoints")
    ck = load_checkpoint(path)
    assert len(list(path.glob("model-*.safetensors"))) > 1
    for k, whole in ck.model.items():
        a, b = l0[k], l1[k]
        assert a[0] + b[0] == whole.shape[0] and a[1:] == b[1:] == tuple(whole.shape[1:]), k  # split on dim 0
        assert ck.ema[k].shape == whole.shape and ck.optimizer["state"][0]["exp_avg"].dim() > 0
    assert sum(v[0] for v in l0.values()) < sum(w.shape[0] for w in ck.model.values())


@pytest.mark.slow
def test_fsdp_matches_one_process_and_its_checkpoint_resumes_on_one(tmp_path):
    # 2 optimizer steps of randomly split parents, chunks of 3: the ranks need different numbers of chunks in a
    # step, and the zero-weight padding keeps FSDP's collectives in step (without it: a hang)
    args = [
        *SETS,
        "--preset",
        "branch",
        "--set",
        "rollout.max_batch=3",
        "--set",
        "train.minibatches=2",
        "--set",
        "train.eval_samples=1",
        "--set",
        "train.sample_every=3",
        "--set",
        "tree.split_steps=[0, 3, 6]",  # 8 leaves a tree: cheaper, still unequal chunk counts across ranks
    ]
    one = treegrpo(*args, "--iterations", 3, "--run-dir", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, *FSDP, "--iterations", 3, "--run-dir", tmp_path / "two", nproc=2)
    assert two.returncode == 0, two.stderr
    rows = read_metrics(tmp_path / "two")
    assert sum(r.pop("pad_chunks") for r in rows) > 0
    close(rows, read_metrics(tmp_path / "one"))
    a, b = (load_checkpoint(list_checkpoints(tmp_path / d / "checkpoints")[-1]) for d in ("two", "one"))
    for k in b.model:  # 6 Adam steps of lr 3e-4; Adam divides a near-zero gradient by its own scale, so the
        # reduce-scatter's summation order shows as up to ~1e-5 in a few weights
        torch.testing.assert_close(a.model[k], b.model[k], rtol=1e-4, atol=2e-5)
    evals = [[e["reward_mean"] for e in read_evals(tmp_path / d)] for d in ("two", "one")]
    assert evals[0] == pytest.approx(evals[1], abs=1e-6) and len(evals[0]) == 2
    assert (tmp_path / "two" / "samples" / "step-3.png").is_file() and (tmp_path / "two" / "before_after.png").is_file()
    part = treegrpo(*args, *FSDP, "--iterations", 2, "--run-dir", tmp_path / "part", nproc=2)
    assert part.returncode == 0, part.stderr
    more = treegrpo("--resume", tmp_path / "part", "--iterations", 3)  # sharded by 2, resumed by 1
    assert more.returncode == 0, more.stderr
    rows = read_metrics(tmp_path / "part")
    for r in rows:
        r.pop("pad_chunks", None)
    close(rows, read_metrics(tmp_path / "one"))
    solo = treegrpo(*args, "--iterations", 2, "--run-dir", tmp_path / "solo")
    assert solo.returncode == 0, solo.stderr
    more = treegrpo("--resume", tmp_path / "solo", "--iterations", 3, *FSDP, nproc=2)  # 1 process, then sharded by 2
    assert more.returncode == 0, more.stderr
    rows = read_metrics(tmp_path / "solo")
    assert "pad_chunks" in rows[-1] and "pad_chunks" not in rows[0]
    rows[-1].pop("pad_chunks")
    close(rows, read_metrics(tmp_path / "one"))
