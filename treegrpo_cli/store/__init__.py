"""Persistence: safetensors shards with hashed indexes, tree shards and checkpoints, all written atomically."""
