"""Policies the engine trains: the embedded pixel and latent shapes models and the diffusers adapters
(one file each, its card naming what it serves: models/catalog.py)."""
