"""The closed library's module name for ``shoal.modelparallel.torch``: this module *is* that
module, so ``import smdistributed.modelparallel.torch as smp`` scripts run unchanged."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("shoal.modelparallel.torch")
