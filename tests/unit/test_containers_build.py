"""Builder choice and build command lines (pure), and the build driver with a fake runner."""

from pathlib import Path

import pytest
from shoal.containers import builder as builders
from shoal.containers import render
from shoal.errors import BuildError

REPO = Path(__file__).resolve().parents[2]
VFS = builders.Buildah(storage_driver="vfs")


def test_docker_is_chosen_when_its_engine_answers():
    assert builders.choose_builder(True, "/usr/bin/buildah") == "docker"
    assert builders.choose_builder(True, None) == "docker"


def test_buildah_when_no_engine_answers():
    assert builders.choose_builder(False, "/usr/bin/buildah") == "buildah"


def test_no_builder_at_all_is_a_build_error():
    with pytest.raises(BuildError, match="no image builder"):
        builders.choose_builder(False, None)


def test_storage_driver_is_overlay_only_with_kernel_support_and_root():
    with_overlay = "nodev\tsysfs\n\text4\nnodev\toverlay\n"
    assert builders.choose_storage_driver(with_overlay, is_root=True) == "overlay"
    assert builders.choose_storage_driver(with_overlay, is_root=False) == "vfs"
    assert builders.choose_storage_driver("nodev\tsysfs\n\text4\n", is_root=True) == "vfs"
    assert builders.choose_storage_driver("nodev\toverlayfs_not\n", is_root=True) == "vfs"


def test_buildah_command_uses_chroot_isolation_the_store_flags_and_the_final_stage(tmp_path):
    argv = builders.build_command("buildah", tmp_path, "localhost/img:1", buildah=VFS)
    assert argv == [
        "buildah", "--storage-driver", "vfs", "bud", "--isolation", "chroot", "--layers",
        "--pull=false", "--target", "final", "--file", str(tmp_path / "Dockerfile"),
        "--tag", "localhost/img:1", str(tmp_path)]


def test_buildah_command_with_a_separate_store(tmp_path):
    store = builders.Buildah(storage_driver="overlay", root="/var/tmp/store")
    argv = builders.build_command("buildah", tmp_path, "t", buildah=store, target=None)
    assert argv[:5] == ["buildah", "--storage-driver", "overlay", "--root", "/var/tmp/store"]
    assert "--target" not in argv


def test_docker_command(tmp_path):
    assert builders.build_command("docker", tmp_path, "img:1") == [
        "docker", "build", "--target", "final", "--file", str(tmp_path / "Dockerfile"),
        "--tag", "img:1", str(tmp_path)]


def test_unknown_builder_is_refused(tmp_path):
    with pytest.raises(BuildError, match="'builder' must be in"):
        builders.build_command("kaniko", tmp_path, "img")


def test_build_image_writes_the_context_and_runs_the_builder(monkeypatch, tmp_path):
    seen = {}

    def fake_run(argv, stdin=None):
        ctx = Path(argv[-1])
        seen["argv"] = argv
        seen["dockerfile"] = (ctx / "Dockerfile").read_text()
        seen["has_setup"] = (ctx / "src" / "setup.py").is_file()

    monkeypatch.setattr(builders, "run", fake_run)
    options = render.BuildOptions("tensorflow", "2.11", "cpu", base="localhost/b:1", python="3")
    name = builders.build_image(options, source_root=REPO, builder="buildah", buildah=VFS)
    assert name == "shoal-tensorflow-training:2.11.0-cpu-py39"
    assert seen["argv"][seen["argv"].index("--tag") + 1] == name
    assert seen["dockerfile"] == render.render_dockerfile(options)  # same version label here
    assert seen["has_setup"]


def test_a_failing_builder_command_is_a_build_error():
    with pytest.raises(BuildError, match="failed with exit status 3"):
        builders.run(["sh", "-c", "exit 3"])
    with pytest.raises(BuildError, match="cannot run"):
        builders.run(["/nonexistent/shoal-builder"])


def test_local_name_is_the_one_local_mode_jobs_run():
    from shoal.image_uris import local_image_name

    options = render.BuildOptions("pytorch", "1.13", "cpu")
    assert options.local_name == local_image_name("pytorch", "1.13", None, "local")


def test_build_refuses_an_entry_whose_python_shoal_does_not_support(monkeypatch):
    monkeypatch.setattr(builders, "run", lambda *a, **k: pytest.fail("nothing may run"))
    options = render.BuildOptions("pytorch", "1.12.1", "gpu")  # py38 in the matrix
    with pytest.raises(BuildError, match="Python >= 3.9"):
        builders.build_image(options, source_root=REPO, builder="buildah", buildah=VFS)
    # With a newer Python of the base it builds.
    newer = render.BuildOptions("pytorch", "1.12.1", "gpu", python="3.9")
    monkeypatch.setattr(builders, "run", lambda argv, stdin=None: None)
    assert builders.build_image(newer, source_root=REPO, builder="buildah", buildah=VFS)


def test_buildahs_own_storage_driver_variable_wins(monkeypatch):
    monkeypatch.setenv("STORAGE_DRIVER", "vfs")
    assert builders.Buildah().storage_driver == "vfs"
    monkeypatch.setenv("STORAGE_DRIVER", "overlay")
    assert builders.detect_storage_driver() == "overlay"


def test_the_label_carries_the_source_trees_version(monkeypatch, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text("")
    (src / "setup.cfg").write_text("[metadata]\nversion = 7.7.7\n[options]\npython_requires = >=3.9\n")
    seen = {}
    monkeypatch.setattr(builders, "run",
                        lambda argv, stdin=None: seen.update(text=(Path(argv[-1]) / "Dockerfile").read_text()))
    options = render.BuildOptions("pytorch", "1.13.1", "cpu", shoal_version="0.0.1")
    builders.build_image(options, source_root=src, builder="buildah", buildah=VFS)
    assert 'ai.shoal.version="7.7.7"' in seen["text"]
