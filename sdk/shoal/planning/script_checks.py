"""The advisor's checks of the training script's text: CPU preprocessing (patterns), and the
model-parallel pitfalls read from its syntax tree (a script that does not parse gives none)."""

from __future__ import annotations

import ast
import re

from shoal.planning.findings import Finding, JobView
from shoal.planning.job_checks import DROP_FIX, TIP_MICROBATCHES, mp_parameters

# The tips, by their titles in the libraries' documentation.
TIP_PREPROCESSING = "Data Preprocessing"
TIP_PARTITIONING = "Manual Partitioning"
TIP_DATA_PREPARATION = "Data Preparation"
TIP_RETURNING = "Returning Tensors from smp.DistributedModel"
TIP_STEP = "The @smp.step Decorator"


# What CPU-bound preprocessing looks like in a training script.
_CPU_PATTERNS = (
    (re.compile(r"num_workers\s*=\s*(\d+)"), "DataLoader num_workers={0}"),
    (re.compile(r"torchvision\.transforms|from torchvision import transforms"),
     "torchvision transforms (on the CPU)"),
    (re.compile(r"\bfrom PIL\b|\bimport PIL\b|Image\.open\("), "PIL image decoding"),
    (re.compile(r"\bimport cv2\b|cv2\.imread|cv2\.imdecode"), "OpenCV decoding"),
)
_MAP_CALL = re.compile(r"\.map\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
HIGH_NUM_WORKERS = 4


def cpu_preprocessing(script_text: str) -> list[str]:
    """What in the script preprocesses data on the CPU during training."""
    found = []
    for pattern, label in _CPU_PATTERNS:
        match = pattern.search(script_text)
        if not match:
            continue
        if match.groups():
            if int(match[1]) < HIGH_NUM_WORKERS:
                continue
            label = label.format(match[1])
        found.append(label)
    if "tf.data" in script_text or "Dataset" in script_text:
        for call in _MAP_CALL.finditer(script_text):
            if "num_parallel_calls" not in call[1]:
                found.append("tf.data map without num_parallel_calls")
                break
    return found


def check_preprocessing(job: JobView) -> list[Finding]:
    if not job.dataparallel or not job.script_text:
        return []
    found = cpu_preprocessing(job.script_text)
    if not found:
        return []
    return [Finding(
        "SHOAL-DP007", "warning",
        f"the training script preprocesses data on the CPU ({', '.join(found)}): the "
        "data-parallel library runs AllReduce on the CPU, so this preprocessing competes "
        "with it",
        "move preprocessing to a GPU library (e.g. NVIDIA DALI, torchvision.transforms.v2 on "
        "CUDA tensors) or complete it before training",
        TIP_PREPROCESSING)]


# ---------------------------------------------------------------- reading the script


def _syntax(text: str | None):
    """The script's syntax tree, None when it is absent or does not parse."""
    if not text:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _called(node: ast.Call) -> str:
    """The dotted name a call calls: ``smp.rank`` for ``smp.rank()``, ``.batch`` for ``x.batch()``."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id + "." if isinstance(func.value, ast.Name) else "."
        return owner + func.attr
    return ""


def _calls(tree) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _keyword_true(call: ast.Call, name: str) -> bool:
    for keyword in call.keywords:
        if keyword.arg == name:
            value = keyword.value
            return not (isinstance(value, ast.Constant) and not value.value)
        if keyword.arg is None:
            return True  # **kwargs may carry it
    return False


def batches_keeping_the_last(text: str) -> list[str]:
    """DataLoader(...) and tf.data .batch(...) calls that keep the epoch's last, smaller batch."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for call in _calls(tree):
        name = _called(call)
        loader = name.endswith("DataLoader") and not _keyword_true(call, "drop_last")
        batch = name.endswith(".batch") and not _keyword_true(call, "drop_remainder")
        if loader or batch:
            found.append(ast.get_source_segment(text, call) or name)
    return found


def check_drop_last(job: JobView) -> list[Finding]:
    if mp_parameters(job) is None:
        return []
    missing = batches_keeping_the_last(job.script_text or "")
    if not missing:
        return []
    return [Finding(
        "SHOAL-MP002", "warning",
        f"{', '.join(missing)} keeps the epoch's last, smaller batch, which must also be "
        "divisible by the number of microbatches", DROP_FIX, TIP_MICROBATCHES)]


_TIED = re.compile(r"tie_weights|tie_word_embeddings|\.weight\s*=\s*[\w.]*\.weight\b")


def check_manual_partition(job: JobView) -> list[Finding]:
    params = mp_parameters(job)
    if params is None or params.get("auto_partition", True) is not False:
        return []
    tied = bool(job.script_text and _TIED.search(job.script_text))
    what = "the script ties weights" if tied else "modules may share parameters"
    return [Finding(
        "SHOAL-MP004", "warning",
        f"manual partitioning (auto_partition False) and {what} (e.g. a tied embedding "
        "table): modules that share a parameter must be placed on the same device",
        "place modules sharing parameters in the same smp.partition() block, or use "
        "auto_partition: True", TIP_PARTITIONING)]


# Calls that shard or seed data; smp.rank() in their arguments splits a model replica's ranks.
_SHARDING_CALLS = ("shard", "seed", "manual_seed", "set_seed", "DistributedSampler")


def shards_by_rank(text: str) -> list[str]:
    """Sharding or seeding calls whose arguments use ``smp.rank()``."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for call in _calls(tree):
        if _called(call).rsplit(".", 1)[-1] not in _SHARDING_CALLS:
            continue
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(_called(inner) == "smp.rank" for arg in arguments for inner in _calls(arg)):
            found.append(ast.get_source_segment(text, call) or _called(call))
    return found


def check_dp_rank(job: JobView) -> list[Finding]:
    if not job.modelparallel:
        return []
    found = shards_by_rank(job.script_text or "")
    if not found:
        return []
    return [Finding(
        "SHOAL-MP005", "warning",
        f"the script shards or seeds its data with smp.rank() ({', '.join(found)}): ranks "
        "of one model replica then see different data",
        "index shards and seed shuffling with smp.dp_rank() (and smp.dp_size())",
        TIP_DATA_PREPARATION)]


def _is_smp_step(decorator) -> tuple[bool, bool]:
    """(is it smp.step, does it name non_split_inputs)."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    is_step = (isinstance(target, ast.Attribute) and target.attr == "step"
               and isinstance(target.value, ast.Name) and target.value.id == "smp")
    return is_step, bool(call and any(k.arg == "non_split_inputs" for k in call.keywords))


def step_functions_without_non_split_inputs(text: str) -> list[tuple[str, list[str]]]:
    """smp.step functions taking more than two tensors and no ``non_split_inputs``."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            is_step, named = _is_smp_step(decorator)
            arguments = [a.arg for a in node.args.args if a.arg not in ("self", "model")]
            if is_step and not named and len(arguments) > 2:
                found.append((node.name, arguments))
    return found


def check_step_inputs(job: JobView) -> list[Finding]:
    if not job.modelparallel:
        return []
    return [Finding(
        "SHOAL-MP006", "info",
        f"smp.step function {name}() takes {arguments}: an argument without a batch "
        "dimension would be split into microbatches",
        "list such arguments by name: @smp.step(non_split_inputs=[...])", TIP_STEP)
        for name, arguments in step_functions_without_non_split_inputs(job.script_text or "")]


def forwards_returning_several(text: str) -> list[str]:
    """Classes whose forward() returns a tuple of two or more values."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not (isinstance(method, ast.FunctionDef) and method.name == "forward"):
                continue
            returns = [n for n in ast.walk(method) if isinstance(n, ast.Return)]
            if any(isinstance(r.value, ast.Tuple) and len(r.value.elts) > 1 for r in returns):
                found.append(cls.name)
    return found


def check_forward_outputs(job: JobView) -> list[Finding]:
    if not job.modelparallel or "DistributedModel" not in (job.script_text or ""):
        return []
    classes = forwards_returning_several(job.script_text)
    if not classes:
        return []
    return [Finding(
        "SHOAL-MP007", "info",
        f"forward() of {classes} returns several tensors: every tensor returned from "
        "smp.DistributedModel is broadcast to all ranks",
        "return only what the training step needs; keep intermediate activations inside "
        "forward()", TIP_RETURNING)]

