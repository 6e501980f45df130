"""The closed library's module name for ``shoal.dataparallel.tensorflow``: this module *is* that module, so that
TensorFlow scripts written for ``smdistributed.dataparallel`` (``import smdistributed.dataparallel.tensorflow as sdp``)
run unchanged on Shoal."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("shoal.dataparallel.tensorflow")
