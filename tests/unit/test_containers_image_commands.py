"""`shoal image build|push` (the click group mounted by the main CLI)."""

from click.testing import CliRunner
from shoal import image_commands
from shoal.containers import builder as builders
from shoal.containers import push, render
from shoal.errors import ImageError


def invoke(*args):
    return CliRunner().invoke(image_commands.image, list(args))


def test_dry_run_prints_the_rendered_dockerfile_and_builds_nothing(monkeypatch):
    monkeypatch.setattr(builders, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    result = invoke("build", "--framework", "pytorch", "--framework-version", "1.13.1",
                    "--processor", "cpu", "--base", "localhost/base:1", "--python", "3", "--dry-run")
    assert result.exit_code == 0, result.output
    expected = render.render_dockerfile(render.BuildOptions(
        "pytorch", "1.13.1", "cpu", base="localhost/base:1", python="3"))
    assert result.output == expected


def test_build_passes_the_options_through(monkeypatch, tmp_path):
    seen = {}

    def fake_build(options, source_root=None, builder=None):
        seen.update(options=options, source=source_root, builder=builder)
        return options.local_name

    monkeypatch.setattr(builders, "build_image", fake_build)
    cert = tmp_path / "proxy.crt"
    cert.write_text("pem")
    result = invoke("build", "--framework", "tensorflow", "--version", "2.11", "--processor", "cpu",
                    "--no-framework", "--ca-certificate", str(cert), "--source", str(tmp_path),
                    "--builder", "buildah")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "shoal-tensorflow-training:2.11.0-cpu-py39"
    options = seen["options"]
    assert options.install_framework is False and options.ca_certificates == (cert,)
    assert seen["source"] == tmp_path and seen["builder"] == "buildah"


def test_unknown_version_is_an_image_error_the_main_cli_maps_to_exit_2(capsys):
    result = invoke("build", "--framework", "pytorch", "--version", "0.4", "--dry-run")
    assert isinstance(result.exception, ImageError)
    assert "no pytorch 0.4 image in the matrix" in str(result.exception)
    from shoal.cli import main

    assert main(["image", "build", "--framework", "pytorch", "--version", "0.4", "--dry-run"]) == 2
    assert "no pytorch 0.4 image in the matrix" in capsys.readouterr().err


def test_bad_base_is_a_usage_error():
    result = invoke("build", "--framework", "pytorch", "--version", "1.13.1", "--base", "a b",
                    "--dry-run")
    assert result.exit_code == 2 and "'base' must match" in result.output


def test_push_to_a_local_layout(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(builders, "run", lambda argv, stdin=None: ran.append(argv))
    result = invoke("push", "--framework", "pytorch", "--version", "1.12", "--processor", "cpu",
                    "--dest", f"oci:{tmp_path}", "--builder", "buildah")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"oci:{tmp_path}:1.12.1-cpu-py38"
    assert ran[0][-2:] == ["shoal-pytorch-training:1.12.1-cpu-py38",
                           f"oci:{tmp_path}:1.12.1-cpu-py38"]


def test_push_options_reach_the_ecr_push(monkeypatch):
    seen = {}
    monkeypatch.setattr(push, "push_image", lambda options, **kw: seen.update(kw) or "uri")
    result = invoke("push", "--framework", "pytorch", "--version", "1.13.1", "--immutable-tags",
                    "--no-scan-on-push", "--account", "210987654321", "--region", "eu-west-1")
    assert result.exit_code == 0, result.output
    assert seen["immutable_tags"] is True and seen["scan_on_push"] is False
    assert seen["account"] == "210987654321" and seen["dest"] is None
    assert seen["region"] == "eu-west-1"
