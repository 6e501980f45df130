"""The instance table: GPUs, memory and peak FLOP/s per instance type."""

import pytest
from shoal.errors import ValidationError
from shoal.planning.instances import INSTANCES, gpus_per_instance, instance


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_every_entry_is_a_plausible_gpu_host(name):
    entry = INSTANCES[name]
    assert entry.name == name and name.startswith("ml.")
    assert entry.gpus >= 1
    assert entry.memory_gib > 0
    assert entry.half_tflops >= entry.fp32_tflops > 0
    assert entry.hbm_gbps > 0 and entry.intra_gbps > 0 and entry.network_gbits > 0


@pytest.mark.parametrize("name, gpus", [
    ("ml.p4d.24xlarge", 8), ("ml.g5.12xlarge", 4), ("ml.g5.xlarge", 1), ("ml.p3.8xlarge", 4),
    ("ml.p5.48xlarge", 8), ("ml.p3.2xlarge", 1),
])
def test_gpus_per_instance_matches_the_aws_instance_pages(name, gpus):
    assert gpus_per_instance(name) == gpus


@pytest.mark.parametrize("name", ["ml.c5.xlarge", "local", "local_gpu", "", None])
def test_gpus_per_instance_is_none_for_types_it_does_not_know(name):
    assert gpus_per_instance(name) is None


def test_published_gpu_figures():
    a100 = instance("ml.p4d.24xlarge")
    assert (a100.gpu, a100.memory_gib, a100.half_tflops) == ("A100", 40, 312)
    assert instance("ml.p4de.24xlarge").memory_gib == 80
    assert instance("ml.p5.48xlarge").gpu == "H100"


def test_a_misspelt_type_suggests_the_closest_one():
    with pytest.raises(ValidationError, match=r"unknown GPU instance type 'ml\.p4dd\.24xlarge'"
                                              r".*did you mean 'ml\.p4d\.24xlarge'"):
        instance("ml.p4dd.24xlarge")


def test_an_unrelated_type_lists_the_known_families():
    with pytest.raises(ValidationError, match=r"'tpu-v4'.*knows .*ml\.p4d\.\*, ") as raised:
        instance("tpu-v4")
    assert "did you mean" not in str(raised.value)


def test_bf16_on_a_gpu_without_it_falls_back_to_the_fp32_peak():
    v100 = instance("ml.p3.16xlarge")
    assert v100.bf16 is False
    assert v100.tflops("bf16") == v100.fp32_tflops == 15.7
    assert v100.tflops("fp16") == 125  # tensor cores
    a100 = instance("ml.p4d.24xlarge")
    assert a100.tflops("bf16") == a100.tflops("fp16") == 312
    assert a100.tflops("fp32") == 19.5
