"""Training: the online loop, the staged stages, the run folder, the process group, export and world pretraining."""
