"""Policies the engine trains: the embedded pixel and latent shapes models and the diffusers adapters
(FLUX, SD3, SD1.5)."""
