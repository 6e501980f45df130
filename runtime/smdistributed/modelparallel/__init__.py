"""``smdistributed.modelparallel``: Shoal's model-parallel runtime under the closed library's
name (``__version__`` is the SMP v1 release whose API it follows)."""

from shoal.modelparallel import __version__  # noqa: F401
