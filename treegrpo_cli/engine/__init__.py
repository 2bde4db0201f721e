"""The method: SDE/ODE kernels, rollout trees, advantage estimators, pruning and the GRPO step (no files, no models)."""
