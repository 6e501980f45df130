"""Shoal's data-parallel collective runtime: the compiled core and its framework APIs."""
