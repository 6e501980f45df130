"""Tensor parallelism: the TP group's collectives and the replacement of supported modules
by ``smp.nn``'s distributed ones."""
