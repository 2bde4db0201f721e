"""Pretraining trials of other DiT shapes, as docs/world.md reports them (not the shipped recipe).

    DEPTH=6 AE_FROM=treegrpo_cli/data/tiny-shapes.safetensors python scripts/pretrain_trial.py --threads 1 \
        --out runs/trial/w.safetensors --log runs/trial/log.jsonl

Runs scripts/pretrain_shapes.py with its options, the DiT's depth and width taken from the environment
(DEPTH, DIM; default the world's 4 and 128; the script's --word-std and --text-layers set the rest), and,
with AE_FROM, the autoencoder of that weights file instead of training one (the shipped file's is what
seed 0 trains, so a trial skips those ten minutes; the DiT then sees other random draws than a full run).
"""

import dataclasses
import os
import runpy
import sys

import treegrpo_cli.world.pretrain as P
from treegrpo_cli.models.dit import TinyDiT

_config = P.latent_dit_config


def shaped(*args, **kw):
    return dataclasses.replace(_config(*args, **kw), depth=int(os.environ.get("DEPTH", 4)),
                               dim=int(os.environ.get("DIM", 128)))


_models = P._models


def models(cfg, init, dit, ae_cfg, prompts, g, log, resumed):
    if resumed or not os.environ.get("AE_FROM"):
        return _models(cfg, init, dit, ae_cfg, prompts, g, log, resumed)
    ae = P.load_weights(os.environ["AE_FROM"])[1]
    net = TinyDiT(dit or shaped(ae_cfg, word_std=cfg.word_std, text_layers=cfg.text_layers))
    return net, ae.requires_grad_(False).eval()


if __name__ == "__main__":
    P.latent_dit_config, P._models = shaped, models
    sys.argv = [os.path.join(os.path.dirname(__file__), "pretrain_shapes.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
