"""The GPUs a host offers: nvidia-smi's list narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it."""

import pytest
from shoal.launcher import environment, gpus

LISTING = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-6b1a2c3d-0000-1111-2222-333344445555)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-7c2b3d4e-0000-1111-2222-333344445555)
GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-8d3c4e5f-0000-1111-2222-333344445555)
GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-9e4d5f60-0000-1111-2222-333344445555)
"""
MIG_LISTING = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)
  MIG 3g.40gb     Device  1: (UUID: MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee)
"""
DEVICES = gpus.parse_list(LISTING)


def test_the_listing_is_parsed_into_indices_and_uuids():
    assert [d.index for d in DEVICES] == [0, 1, 2, 3]
    assert DEVICES[2].uuid == "GPU-8d3c4e5f-0000-1111-2222-333344445555"
    assert gpus.parse_list("No devices were found\n") == []


def test_mig_instances_are_devices_after_the_gpus():
    devices = gpus.parse_list(MIG_LISTING)
    assert [d.uuid[:12] for d in devices] == ["GPU-11111111", "MIG-aaaaaaaa", "MIG-ffffffff"]
    assert [d.uuid[:12] for d in gpus.visible(devices, "MIG-ffff")] == ["MIG-ffffffff"]


@pytest.mark.parametrize("setting,indices", [
    (None, [0, 1, 2, 3]),            # unset: every device
    ("2,3", [2, 3]),
    ("3,1", [3, 1]),                 # in the order given
    ("", []),                        # set but empty: none
    ("-1", []),
    ("NoDevFiles", []),
    ("0,7,1", [0]),                  # read up to the first invalid entry
    ("1,1,2", [1]),                  # a device named twice ends the list
    (" 1 , 2", [1, 2]),
    ("GPU-8d3c,GPU-6b1a", [2, 0]),   # UUID prefixes
    ("GPU-", []),                    # an ambiguous prefix is invalid
])
def test_visible_devices_follow_cudas_rules(setting, indices):
    assert [d.index for d in gpus.visible(DEVICES, setting)] == indices


def test_count_reads_the_environment_and_is_zero_without_nvidia_smi(monkeypatch):
    assert gpus.count({"CUDA_VISIBLE_DEVICES": "0,2"}, DEVICES) == 2
    assert gpus.count({}, DEVICES) == 4
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.list_devices() == [] and gpus.count({}) == 0


def test_the_launchers_gpu_count_honours_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(gpus, "list_devices", lambda: DEVICES)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,0")
    assert environment.count_gpus() == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert environment.count_gpus() == 4
