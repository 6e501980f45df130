"""The closed library's module name for ``shoal.dataparallel.torch.torch_smddp``: this module *is* that module, so that
scripts written for ``smdistributed.dataparallel`` run unchanged on Shoal."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("shoal.dataparallel.torch.torch_smddp")
