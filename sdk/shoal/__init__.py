"""Shoal: open, SageMaker-compatible distributed training."""

__version__ = "0.1.0"
