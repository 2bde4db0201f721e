"""Rewards: images and prompts in, scores out (shapes, JPEG, HPS, PickScore, ImageReward, CLIP, aesthetic)."""
