"""``smdistributed.dataparallel.torch``: Shoal's PyTorch data parallelism under the closed
library's module names (``distributed``, ``parallel.distributed``, ``torch_smddp``)."""
