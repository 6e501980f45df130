"""Compatibility namespace: scripts written for SageMaker's closed
``smdistributed`` libraries import Shoal's implementations through it."""
