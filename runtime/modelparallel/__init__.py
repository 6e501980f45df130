"""Shoal's model-parallel runtime: the API of SageMaker's model parallel library (SMP v1).

``shoal.modelparallel.torch`` is the PyTorch API; scripts written for SageMaker import it as
``smdistributed.modelparallel.torch``. Pipeline stages talk through Shoal's collective core
(point-to-point transfers on sub-communicators, shared memory inside a host).
"""

__version__ = "1.15.0"  # the SMP v1 release whose API this follows (HF checks >= 1.10)
