"""``smp.nn.huggingface``: Hugging Face models distributed by tensor parallelism.

Created inside ``smp.tensor_parallelism()`` (or ``smp.model_creation(tensor_parallelism=
True)``), these Hugging Face modules are replaced at ``smp.DistributedModel`` by SMP's
distributed transformer modules, their weights translated:

    GPT2LMHeadModel    -> DistributedTransformerLMHead   (gpt2)
    BertEncoder        -> DistributedTransformer         (bert)
    RobertaEncoder     -> DistributedTransformer         (roberta)
    GPTJForCausalLM    -> DistributedTransformerLMHead   (gptj)
    GPTNeoXForCausalLM -> DistributedTransformerLMHead   (gptneox)

Each family's module has the two state-dict translators (HF <-> SMP names). ``transformers``
is optional: nothing here imports it until one of those model families is imported, and
the family is registered then (importing all of ``transformers`` up front would cost every
process seconds).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys

log = logging.getLogger("shoal.modelparallel")

FAMILIES = {
    "transformers.models.gpt2.modeling_gpt2": "gpt2",
    "transformers.models.bert.modeling_bert": "bert",
    "transformers.models.roberta.modeling_roberta": "roberta",
    "transformers.models.gptj.modeling_gptj": "gptj",
    "transformers.models.gpt_neox.modeling_gpt_neox": "gptneox",
}


def register_family(module_name: str) -> None:
    family = importlib.import_module(f"shoal.modelparallel.torch.nn.huggingface.{FAMILIES[module_name]}")
    try:
        family.register()
    except Exception as err:  # an HF version without the class: the others still work
        log.warning("tensor parallelism: %s is not distributed: %s", module_name, err)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers a model family once ``transformers`` has executed its modelling module."""

    _smp_hf_finder = True

    def find_spec(self, fullname, path, target=None):
        if fullname not in FAMILIES:
            return None
        for finder in sys.meta_path:
            if finder is self or getattr(finder, "_smp_hf_finder", False):
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        register_family(module.__name__)


def install() -> None:
    """Registers the families already imported and the others as they are (once per
    process, whatever name this package was imported under)."""
    if any(getattr(f, "_smp_hf_finder", False) for f in sys.meta_path):
        return
    try:
        if importlib.util.find_spec("transformers") is None:
            return
    except (ImportError, ValueError):  # blocked (sys.modules entry None) or broken
        return
    sys.meta_path.insert(0, _RegisterOnImport())
    for name in FAMILIES:
        if name in sys.modules:
            register_family(name)


install()
