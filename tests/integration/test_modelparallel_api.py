"""The SMP v1 API surface in one process (a job of one rank): configuration from
``SM_HP_MP_PARAMETERS`` over ``smp.init``'s dict, refused parameters, the wrappers scripts
reach through (``model.module.module``, the optimizer itself), ``smp.step``'s errors, and the
process groups. Each case runs in a fresh interpreter: a process initializes smp once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.torch]


def run(body: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = "import torch, torch.nn as nn\nimport smdistributed.modelparallel.torch as smp\n"
    script += textwrap.dedent(body)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SM_HP_"))}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environ, timeout=180)


def ok(body: str, env: dict | None = None) -> str:
    done = run(body, env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_environment_parameters_win_over_the_dict_and_state_cfg_reads_them():
    out = ok("""
        smp.init({"microbatches": 2, "pipeline": "simple", "memory_weight": 0.3})
        cfg = smp.state.cfg
        print(cfg.microbatches, cfg.pipeline, cfg.memory_weight, cfg.fp16, smp.num_microbatches())
        print(smp.is_initialized(), smp.__name__, smp.rank(), smp.size(), smp.dp_size())
    """, {"SM_HP_MP_PARAMETERS": json.dumps({"microbatches": 4})})
    # 4 from the environment; simple needs active == microbatches (default min(pp+2, m) = 3).
    assert out.splitlines()[0] == "4 interleaved 0.3 False 4"
    assert out.splitlines()[1] == "True shoal.modelparallel.torch 0 1 1"


def test_import_initializes_under_mpirun_with_parameters_unless_manual():
    env = {"SM_HP_MP_PARAMETERS": json.dumps({"microbatches": 2}),
           "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    assert ok("print(smp.is_initialized())", env).strip() == "True"
    assert ok("print(smp.is_initialized())", {**env, "SMP_MANUAL_INIT": "1"}).strip() == "False"


@pytest.mark.parametrize("parameters, expected", [
    ({"tensor_parallel_degree": 2}, "tensor_parallel_degree to non-default value 2 requires ddp"),
    ({"tensor_parallel_degree": 2, "ddp": True}, "must be divisible by pipeline_parallel_degree"),
    ({"bf16": True, "fp16": True}, "bf16 to non-default value True requires fp16"),
    ({"sharded_data_parallel_degree": 2}, "sharded_data_parallel_degree to non-default value 2 "
                                           "requires ddp"),
    ({"sharded_data_parallel_degree": 2, "ddp": True},
     "ZeRO-2D sharding degree (2) cannot be larger than the data parallelism degree (1)."),
    ({"microbatchs": 2}, "Unrecognized config parameter microbatchs"),
    ({"microbatches": "4"}, "microbatches"),
])
def test_refused_parameters_are_named(parameters, expected):
    done = run("smp.init()", {"SM_HP_MP_PARAMETERS": json.dumps(parameters)})
    assert done.returncode != 0 and expected in done.stderr, done.stderr


def test_the_wrappers_scripts_reach_through():
    out = ok("""
        smp.init({"ddp": True, "microbatches": 2})
        net = nn.Linear(4, 2)
        try:
            smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        except Exception as exc:
            print("early:", exc)
        model = smp.DistributedModel(net)
        print(model.module.module is net, model.get_module() is net,
              isinstance(model, smp.model.DistributedModel))
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = smp.DistributedOptimizer(sgd)
        print(optimizer is sgd, type(torch.optim.lr_scheduler.StepLR(optimizer, 1)).__name__)
        try:
            smp.DistributedModel(nn.Linear(2, 2))
        except Exception as exc:
            print("second:", exc)
        try:
            model.backward(torch.ones(()))
        except Exception as exc:
            print("backward:", exc)
        print(type(smp.get_dp_process_group()).__name__, smp.get_dp_group(), smp.get_pp_group())
    """)
    lines = out.splitlines()
    assert lines[0] == ("early: smp.DistributedModel call must take place before "
                        "smp.DistributedOptimizer.")
    assert lines[1] == "True True True"
    assert lines[2] == "True StepLR"
    assert lines[3] == "second: smp.DistributedModel can be created only once per process"
    assert lines[4] == ("backward: smp.DistributedModel's backward can only be run inside "
                        "smp.step annotated function")
    assert lines[5] == "ProcessGroup [0] [0]"


def test_process_groups_need_ddp():
    out = ok("""
        smp.init({"microbatches": 1})
        try:
            smp.get_dp_process_group()
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    assert out.strip() == ("DDPNotEnabledError Torch.dist is not initialized. Please enable "
                           "DDP in config to use torch.dist")


def test_step_splits_averages_and_explains_a_bad_batch():
    out = ok("""
        import torch.nn.functional as F
        smp.init({"microbatches": 2})
        torch.manual_seed(0)
        net = nn.Linear(3, 1)
        reference = nn.Linear(3, 1)
        reference.load_state_dict(net.state_dict())
        model = smp.DistributedModel(net)

        @smp.step(non_split_inputs=["scale"])
        def step(model, x, y, scale):
            out = model(x) * scale
            loss = F.mse_loss(out, y)
            model.backward(loss)
            return loss, out, loss.item()

        x, y = torch.randn(6, 3), torch.randn(6, 1)
        loss, out, floats = step(model, x, y, torch.tensor(2.0))
        F.mse_loss(reference(x) * 2.0, y).backward()
        print(len(loss.outputs), len(floats), tuple(out.concat().shape))
        print(torch.allclose(net.weight.grad, reference.weight.grad, atol=1e-6))
        try:
            step(model, torch.randn(5, 3), torch.randn(5, 1), torch.tensor(1.0))
        except ValueError as exc:
            print("drop_last=True" in str(exc), "Batch size must be divisible" in str(exc))
    """)
    assert out.splitlines() == ["2 2 (6, 1)", "True", "True True"]


def test_save_and_load_partial_and_full(tmp_path):
    out = ok(f"""
        smp.init({{"microbatches": 1}})
        model = smp.DistributedModel(nn.Linear(2, 2))
        smp.save(model.state_dict(), {str(tmp_path / "full.pt")!r}, partial=False)
        smp.save(model.local_state_dict(), {str(tmp_path / "part")!r}, partial=True)
        full = smp.load({str(tmp_path / "full.pt")!r}, partial=False)
        part = smp.load({str(tmp_path / "part")!r}, partial=True)
        print(sorted(full), sorted(part))
    """)
    assert out.strip() == "['bias', 'weight'] ['_smp_is_partial', 'bias', 'weight']"
    assert (tmp_path / "part_0_0.pt").exists()


def test_without_a_pipeline_microbatches_run_one_after_another():
    # the model counts forwards under way until their backward: one stage's scheduler gives
    # a microbatch's backward the turn before the next forward (the cost model relies on it)
    out = ok("""
        import threading
        smp.init({"microbatches": 4, "ddp": True})
        lock, live, most = threading.Lock(), [0], [0]

        class Counting(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

            def forward(self, x):
                with lock:
                    live[0] += 1
                    most[0] = max(most[0], live[0])
                return self.b(torch.relu(self.a(x)))

        model = smp.DistributedModel(Counting())

        @smp.step
        def train(model, x):
            loss = model(x).sum()
            model.backward(loss)
            with lock:
                live[0] -= 1
            return loss

        for _ in range(2):
            losses = train(model, torch.randn(8, 4))
        print(smp.state.cfg.active_microbatches, most[0], len(losses.outputs))
    """)
    # SMP's active_microbatches is min(pipeline + 2, 4) = 3; one stage still runs one at a time
    assert out.split() == ["3", "1", "4"]
