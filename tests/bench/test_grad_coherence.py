"""bench/grad_coherence.py: the batch gradient it measures is the iteration's whole objective's."""

import torch
from benchmods import load as _bench


def test_the_measured_gradient_does_not_depend_on_the_update_schedule():
    """Two optimizer steps of node sums (tree-grpo's schedule) and one step of the mean measure one gradient: every
    trained edge's, not the last step's alone."""
    from treegrpo_cli.config import load_config
    from treegrpo_cli.training.trainer import Trainer
    from treegrpo_cli.world.shapes import load_split

    gc = _bench("grad_coherence")
    prompts = load_split("rl_train")[:2]
    grads = {}
    for sched in (("train.minibatches=2", 'train.loss_norm="node-sum"'), ("train.minibatches=1",)):
        cfg = load_config("tree-grpo", sets=['model="tiny-shapes"', *sched])
        torch.manual_seed(0)
        grads[sched] = gc.batch_gradients(Trainer(cfg, "cpu"), prompts, 3, [(0, 2)])[0][0]
    two, one = grads.values()
    assert two is not None and one is not None and one.norm() > 0
    torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-6 * float(one.abs().max()))
