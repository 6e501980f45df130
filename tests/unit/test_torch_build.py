"""The c10d extension's build cache: keys, location, and the lock that serializes ranks."""

import multiprocessing
import time
from pathlib import Path

from shoal.dataparallel.torch import build


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_digest_changes_with_content_name_and_flags(tmp_path):
    a = _write(tmp_path / "a.cpp", "int a;")
    b = _write(tmp_path / "b.h", "int b;")
    base = build.source_digest([a, b])
    assert base == build.source_digest([a, b])
    assert len(base) == 16
    assert build.source_digest([a, b], flags=("-O2",)) != base
    _write(b, "int b2;")
    assert build.source_digest([a, b]) != base
    renamed = _write(tmp_path / "c.h", "int b2;")
    assert build.source_digest([a, renamed]) != build.source_digest([a, b])


def test_build_directory_is_keyed_by_torch_version_and_digest(tmp_path):
    directory = build.build_directory(tmp_path, "2.13.0+cpu", "0123abcd")
    assert directory == tmp_path / "torch-2.13.0_cpu" / "0123abcd"
    assert build.build_directory(tmp_path, "2.14.0", "0123abcd") != directory


def test_cache_root_honours_the_environment(tmp_path):
    assert build.cache_root({"SHOAL_EXTENSION_DIR": str(tmp_path)}) == tmp_path
    home = tmp_path / "home"
    assert build.cache_root({"HOME": str(home)}) == home / ".cache" / "shoal" / "torch_ext"


def test_sources_are_the_backend_translation_units():
    names = [path.name for path in build.source_files()]
    assert "process_group_shoal.cpp" in names
    assert names == sorted(names)


def test_header_files_lists_the_core_headers(tmp_path):
    (tmp_path / "shoal").mkdir()
    _write(tmp_path / "shoal" / "core.h", "")
    _write(tmp_path / "shoal" / "notes.txt", "")
    assert [p.name for p in build.header_files(tmp_path)] == ["core.h"]


def _hold_lock(directory, entered, log):
    with build.exclusive_lock(Path(directory)):
        entered.set()
        with open(log, "a") as handle:
            handle.write("start-a\n")
        time.sleep(0.5)
        with open(log, "a") as handle:
            handle.write("end-a\n")


def test_exclusive_lock_serializes_processes(tmp_path):
    log = tmp_path / "log"
    context = multiprocessing.get_context("fork")
    entered = context.Event()
    holder = context.Process(target=_hold_lock, args=(str(tmp_path / "dir"), entered, log))
    holder.start()
    assert entered.wait(10)
    with build.exclusive_lock(tmp_path / "dir"):
        with open(log, "a") as handle:
            handle.write("b\n")
    holder.join(10)
    assert log.read_text().splitlines() == ["start-a", "end-a", "b"]


def test_exclusive_lock_is_released_when_the_holder_dies(tmp_path):
    context = multiprocessing.get_context("fork")
    entered = context.Event()

    def die_holding():
        with build.exclusive_lock(tmp_path / "dir"):
            entered.set()
            import os

            os._exit(1)

    holder = context.Process(target=die_holding)
    holder.start()
    assert entered.wait(10)
    holder.join(10)
    with build.exclusive_lock(tmp_path / "dir"):
        pass


def test_build_failures_are_runtime_failures(tmp_path):
    import pytest
    from shoal.errors import RuntimeFailure

    with pytest.raises(RuntimeFailure, match="c10d extension in .* failed.*no compiler"):
        with build._explained(tmp_path):
            raise RuntimeError("no compiler")


def test_the_backend_takes_cuda_tensors_only_where_torch_is_built_with_cuda(monkeypatch):
    import torch
    from shoal.dataparallel.torch import backend

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert backend.backend_devices() == ["cpu"]
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    assert backend.backend_devices() == ["cpu", "cuda"]
