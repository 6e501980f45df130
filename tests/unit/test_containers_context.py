"""The build context: the rendered Dockerfile plus a filtered copy of the repository, with
no secret, VCS data or host path in it."""

import os
from pathlib import Path

import pytest
from shoal.containers import context, render
from shoal.errors import BuildError

REPO = Path(__file__).resolve().parents[2]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRETfake"
TOKEN = "FQoGZXIvYXdzEJr//////////fakeSESSIONtoken"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A source tree and a home full of things that must never reach an image."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIAFAKEFAKEFAKE\naws_secret_access_key = {SECRET}\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)

    src = tmp_path / "checkout"
    for rel in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(f"# {rel}\n" if rel != "setup.cfg" else "[options]\n")
    code = src / "sdk" / "shoal"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text('"""shoal"""\n')
    (src / "runtime" / "launcher").mkdir(parents=True)
    (src / "runtime" / "launcher" / "entrypoint.py").write_text("def main(): pass\n")
    # Things that must be left out, at the top and deep inside.
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text(f"[credential]\n\thelper = {SECRET}\n")
    (src / ".venv" / "bin").mkdir(parents=True)
    (src / ".venv" / "bin" / "python").write_text("#!host python\n")
    (src / ".env").write_text(f"AWS_SECRET_ACCESS_KEY={SECRET}\n")
    (code / ".env").write_text(f"TOKEN={TOKEN}\n")
    (code / "credentials").write_text(SECRET)
    (code / "server.pem").write_text(SECRET)
    (code / "id_ed25519").write_text(SECRET)
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (code / "_core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF host build")
    (src / "shoal.egg-info").mkdir()
    (src / "shoal.egg-info" / "SOURCES.txt").write_text(str(src))
    (src / "notes-outside-allowlist.txt").write_text(SECRET)
    # Links out of the tree: to the home's credentials, and a linked directory.
    (code / "creds_link.py").symlink_to(home / ".aws" / "credentials")
    (code / "linked_dir").symlink_to(home / ".aws", target_is_directory=True)
    return src, home


def all_bytes(root):
    for dirpath, _, files in os.walk(root):
        for name in files:
            yield Path(dirpath, name), Path(dirpath, name).read_bytes()


def test_context_holds_dockerfile_dockerignore_and_only_allowed_sources(planted, tmp_path):
    src, _ = planted
    ctx = context.write_context(tmp_path / "ctx", "FROM scratch\n", src)
    files = sorted(str(p.relative_to(ctx)) for p, _ in all_bytes(ctx))
    assert files == [".dockerignore", "Dockerfile", "requirements.txt", "src/README.md", "src/pyproject.toml",
                     "src/runtime/launcher/entrypoint.py", "src/sdk/shoal/__init__.py",
                     "src/setup.cfg", "src/setup.py"]


def test_no_secret_or_host_path_leaks_into_the_context(planted, tmp_path):
    src, home = planted
    options = render.BuildOptions("pytorch", "1.13.1", "cpu", base="localhost/base:1", python="3")
    ctx = context.write_context(tmp_path / "ctx", render.render_dockerfile(options), src)
    for path, data in all_bytes(ctx):
        for needle in (SECRET, TOKEN, "AKIAFAKE", str(home), str(src), str(tmp_path)):
            assert needle.encode() not in data, f"{needle!r} leaked into {path}"
    dockerfile = (ctx / "Dockerfile").read_text()
    assert "AWS_SECRET" not in dockerfile and "AWS_SESSION_TOKEN" not in dockerfile


def test_real_repository_context_excludes_vcs_venv_and_build_output():
    files = [str(p) for p in context.source_files(REPO)]
    assert "setup.py" in files and "setup.cfg" in files
    assert "containers/templates/base.Dockerfile.j2" in files
    assert "containers/files/shoal_hostname.c" in files
    assert "sdk/shoal/errors.py" in files
    for path in files:
        parts = Path(path).parts
        assert not any(part.startswith(".") for part in parts), path
        assert "__pycache__" not in parts and not path.endswith((".pyc", ".so")), path
        assert parts[0] in context.SOURCE_ENTRIES, path


def test_ca_certificates_are_copied_under_their_names(planted, tmp_path):
    src, _ = planted
    cert = tmp_path / "elsewhere" / "proxy.crt"
    cert.parent.mkdir()
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    ctx = context.write_context(tmp_path / "ctx", "FROM scratch\n", src, (cert,))
    assert (ctx / "certs" / "proxy.crt").read_text() == cert.read_text()


def test_dockerignore_excludes_secrets_as_a_second_line(tmp_path, planted):
    src, _ = planted
    ignore = (context.write_context(tmp_path / "ctx", "", src) / ".dockerignore").read_text()
    for pattern in ("**/.git", "**/.aws", "**/.env", "**/*.pem", "**/credentials"):
        assert pattern in ignore.splitlines()


def test_refuses_a_non_empty_destination_or_a_tree_without_setup_py(planted, tmp_path):
    src, _ = planted
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(BuildError, match="not empty"):
        context.write_context(tmp_path / "busy", "", src)
    with pytest.raises(BuildError, match="not a Shoal source tree"):
        context.write_context(tmp_path / "ctx", "", tmp_path / "home")


@pytest.mark.parametrize("name,excluded", [
    (".git", True), (".aws", True), ("credentials", True), ("id_rsa.pub", True), ("tls.key", True),
    ("__pycache__", True), ("x.pyc", True), ("shoal.egg-info", True), ("core.so", True),
    ("credentials.py", False), ("errors.py", False), ("base.Dockerfile.j2", False),
    ("shoal_hostname.c", False),
])
def test_exclusion_rules(name, excluded):
    assert context.is_excluded(name) is excluded


def test_requirements_come_from_setup_cfg_with_the_mpi_extra(tmp_path):
    text = context.requirements(
        "[options]\ninstall_requires =\n    boto3>=1.28\n    numpy>=1.24\n"
        "[options.extras_require]\nmpi = mpi4py>=3.1\ntorch = torch==2.13.0\n")
    assert text == "boto3>=1.28\nnumpy>=1.24\nmpi4py>=3.1\n"


def test_real_requirements_match_the_package_metadata():
    from importlib import metadata

    wanted = context.requirements((REPO / "setup.cfg").read_text()).splitlines()
    declared = metadata.requires("shoal")
    for line in wanted:
        assert any(req.replace(" ", "").startswith(line) for req in declared), line


def test_an_image_python_below_shoals_minimum_is_refused_before_building():
    cfg = "[options]\npython_requires = >=3.9\n"
    assert context.minimum_python(cfg) == (3, 9)
    context.check_python("3.9", cfg)
    context.check_python("3.11", cfg)
    context.check_python("3", cfg)  # the base's python3: pip decides
    with pytest.raises(BuildError, match=r"Shoal needs Python >= 3.9; this image's Python is 3.8"):
        context.check_python("3.8", cfg)
    context.check_python("3.6", "[options]\n")  # no floor declared
