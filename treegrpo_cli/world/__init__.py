"""The embedded shapes world: scenes, prompts and renders (shapes.py) and a rule-based detector (detect.py)."""
