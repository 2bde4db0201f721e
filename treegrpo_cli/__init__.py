"""treegrpo: tree-structured GRPO for text-to-image flow-matching models."""

__version__ = "0.1.0"
