"""Rendering every image of the version matrix: bases, CUDA, the MPI/NCCL/EFA stack,
the runtime install and the entrypoint."""

import json
import re
import subprocess

import jinja2
import pytest
from shoal.containers import matrix, render
from shoal.errors import ImageError

ALL = [(spec, processor) for spec in matrix.specs() for processor in matrix.PROCESSORS]
IDS = [f"{s.framework}-{s.framework_version}-{p}" for s, p in ALL]


def options(spec, processor, **kw):
    return render.BuildOptions(spec.framework, spec.framework_version, processor, **kw)


def stages(text):
    """FROM lines as (image, stage name)."""
    return re.findall(r"^FROM (\S+) AS (\S+)$", text, flags=re.M)


def stage_body(text, name):
    return text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]


def test_the_matrix_has_the_cuda11_images_the_platform_supports():
    have = {(s.framework, s.framework_version, s.cuda_tag) for s in matrix.specs()}
    assert {("pytorch", "1.12.1", "cu113"), ("pytorch", "1.13.1", "cu117"),
            ("tensorflow", "2.10.1", "cu112"), ("tensorflow", "2.11.0", "cu112")} <= have
    assert all(s.cuda.startswith("11.") for s in matrix.specs())


@pytest.mark.parametrize("spec,processor", ALL, ids=IDS)
def test_every_image_has_system_builder_final_stages_on_its_base(spec, processor):
    text = render.render_dockerfile(options(spec, processor))
    base = spec.gpu_base if processor == "gpu" else spec.cpu_base
    assert stages(text) == [(base, "system"), ("system", "builder"), ("system", "final")]
    assert "{{" not in text and "{%" not in text


@pytest.mark.parametrize("spec", matrix.specs(), ids=lambda s: f"{s.framework}-{s.framework_version}")
def test_gpu_images_build_the_cuda_communication_stack(spec):
    text = render.render_dockerfile(options(spec, "gpu"))
    tools = spec.toolchain()
    assert f"nvidia/cuda:{spec.cuda}." in spec.gpu_base and "-devel-" in spec.gpu_base
    # NCCL from NVIDIA's tag for this entry.
    assert f"--branch v{spec.nccl}-1 https://github.com/NVIDIA/nccl.git" in text
    assert "src.build BUILDDIR=/usr/local" in text
    # EFA installer without kernel module, its own Open MPI removed.
    assert f"aws-efa-installer-{tools['efa']}.tar.gz" in text
    assert "./efa_installer.sh -y --skip-kmod -g" in text
    assert "rm -rf /opt/amazon/openmpi" in text
    # Open MPI from source with CUDA, checked after the build.
    assert f"openmpi-{tools['openmpi']}.tar.gz" in text
    configure = re.search(r"\./configure --prefix=/opt/amazon/openmpi[^\n]*", text).group(0)
    assert "--with-cuda=/usr/local/cuda" in configure
    assert "--enable-orterun-prefix-by-default" in configure
    assert "mpi_built_with_cuda_support:value:true" in text
    # aws-ofi-nccl against that libfabric, MPI and NCCL; built after both exist.
    assert f"--branch v{tools['aws_ofi_nccl']} https://github.com/aws/aws-ofi-nccl.git" in text
    assert "--with-libfabric=/opt/amazon/efa" in text and "--with-nccl=/usr/local" in text
    order = [text.index(marker) for marker in
             ("NVIDIA/nccl.git", "efa_installer.sh", "openmpi-4", "aws-ofi-nccl.git")]
    assert order == sorted(order)
    assert f"python{spec.python}-venv" in text
    assert "/opt/amazon/openmpi/bin/mpirun.real" in text
    assert "/opt/amazon/openmpi/etc/openmpi-mca-params.conf" in text
    assert f'ai.shoal.cuda="{spec.cuda}"' in text and f'ai.shoal.nccl="{spec.nccl}"' in text


@pytest.mark.parametrize("spec", matrix.specs(), ids=lambda s: f"{s.framework}-{s.framework_version}")
def test_cpu_images_use_the_distributions_open_mpi_and_no_cuda(spec):
    text = render.render_dockerfile(options(spec, "cpu"))
    for absent in ("nvidia/cuda", "NVIDIA/nccl", "efa_installer", "aws-ofi-nccl", "--with-cuda",
                   "ai.shoal.cuda"):
        assert absent not in text
    assert "openmpi-bin" in stage_body(text, "system")
    assert "libopenmpi-dev" in stage_body(text, "builder")
    assert "mv /usr/bin/mpirun /usr/bin/mpirun.real" in text
    assert "'/usr/bin/mpirun.real' > /usr/bin/mpirun" in text
    assert "/etc/openmpi/openmpi-mca-params.conf" in text


@pytest.mark.parametrize("spec,processor", ALL, ids=IDS)
def test_runtime_is_built_into_wheels_and_installed_offline_in_the_final_stage(spec, processor):
    text = render.render_dockerfile(options(spec, processor))
    builder, final = stage_body(text, "builder"), stage_body(text, "final")
    # Dependencies first (their own cached layer), then Shoal from the copied source tree.
    deps = builder.index("--wheel-dir /opt/shoal/deps -r /opt/shoal/requirements.txt")
    assert builder.index("COPY requirements.txt") < deps < builder.index("COPY src /opt/shoal/src")
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /opt/shoal/wheels /opt/shoal/src" in builder
    assert "libshoal_hostname.so" in builder and "shoal_hostname.c" in builder
    # The final stage never sees the source tree, only wheels, installed without an index.
    assert "COPY src /opt" not in final
    assert "COPY --from=builder /opt/shoal/deps /opt/shoal/deps" in final
    assert "--no-index --find-links /opt/shoal/deps -r /opt/shoal/requirements.txt" in final
    assert "--no-index --no-deps /opt/shoal/wheels/shoal-*.whl" in final
    assert "python -m pip check" in final
    assert "test -x /opt/shoal/venv/bin/train" in final
    assert "test -x /opt/shoal/venv/bin/shoal-rank" in final
    # The framework goes in before Shoal's deps, which then keep to NumPy 1 like it.
    assert final.index("--extra-index-url" if spec.framework == "pytorch" else "tensorflow") \
        < final.index("/opt/shoal/deps")
    assert '-r /opt/shoal/requirements.txt "numpy<2"' in final


def test_runtime_only_images_do_not_pin_numpy():
    text = render.render_dockerfile(render.BuildOptions("pytorch", "1.13.1", "cpu",
                                                        install_framework=False))
    assert "numpy<2" not in text


@pytest.mark.parametrize("spec,processor", ALL, ids=IDS)
def test_final_stage_sets_what_the_launcher_needs(spec, processor):
    final = stage_body(render.render_dockerfile(options(spec, processor)), "final")
    assert final.rstrip().endswith('ENTRYPOINT ["/usr/local/bin/shoal-entrypoint"]\nCMD ["train"]')
    assert "ENV SAGEMAKER_TRAINING_MODULE=shoal.launcher.entrypoint:main" in final
    assert "SHOAL_GETHOSTNAME_PRELOAD=/usr/local/lib/libshoal_hostname.so" in final
    assert "StrictHostKeyChecking no" in final and "ssh-keygen -A" in final
    assert "Port 22" in final and "PasswordAuthentication no" in final
    assert "pam_loginuid.so" in final
    for mca in ("hwloc_base_binding_policy = none", "rmaps_base_mapping_policy = slot",
                "btl_vader_single_copy_mechanism = none"):
        assert mca in final
    # The launcher passes -mca btl/oob_tcp_if_include; Open MPI refuses include with exclude.
    assert "tcp_if_exclude" not in final
    assert "--allow-run-as-root" in final and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in final
    assert "/usr/local/lib/libshoal_hostname.so" in final
    system = stage_body(render.render_dockerfile(options(spec, processor)), "system")
    assert "PYTHONUNBUFFERED=1" in system and "LD_LIBRARY_PATH=" in system
    assert "PATH=/opt/shoal/venv/bin:$PATH" in system


@pytest.mark.parametrize("spec,processor", ALL, ids=IDS)
def test_labels_carry_the_versions(spec, processor):
    text = render.render_dockerfile(options(spec, processor, shoal_version="9.8.7"))
    assert f'org.opencontainers.image.version="{spec.tag(processor)}"' in text
    assert f'org.opencontainers.image.title="{spec.repository()}"' in text
    assert 'ai.shoal.version="9.8.7"' in text
    assert f'ai.shoal.framework-version="{spec.framework_version}"' in text
    assert f'ai.shoal.python="{spec.python}"' in text


def test_framework_install_matches_processor_and_can_be_left_out():
    pt = matrix.find("pytorch", "1.13")
    gpu = render.render_dockerfile(options(pt, "gpu"))
    assert '"torch==1.13.1+cu117"' in gpu and "download.pytorch.org/whl/cu117" in gpu
    cpu = render.render_dockerfile(options(pt, "cpu"))
    assert '"torch==1.13.1+cpu"' in cpu and "download.pytorch.org/whl/cpu" in cpu
    tf = matrix.find("tensorflow", "2.11")
    assert '"tensorflow==2.11.0"' in render.render_dockerfile(options(tf, "gpu"))
    assert '"tensorflow-cpu==2.11.0"' in render.render_dockerfile(options(tf, "cpu"))
    bare = render.render_dockerfile(options(pt, "cpu", install_framework=False))
    assert "torch==" not in bare and 'ai.shoal.framework-installed="false"' in bare


def test_base_and_python_overrides_for_a_local_debian_base():
    spec = matrix.find("pytorch", "1.13.1")
    text = render.render_dockerfile(options(spec, "cpu", base="localhost/base:bookworm", python="3"))
    assert stages(text)[0] == ("localhost/base:bookworm", "system")
    assert "python3 -m venv /opt/shoal/venv" in text
    assert "    python3-venv \\" in text and "python3.9" not in text


def test_extra_ca_certificates_are_trusted_only_when_given(tmp_path):
    spec = matrix.find("pytorch", "1.13.1")
    assert "update-ca-certificates" not in render.render_dockerfile(options(spec, "cpu"))
    cert = tmp_path / "proxy.crt"
    text = render.render_dockerfile(options(spec, "cpu", ca_certificates=[cert]))
    assert "COPY certs/ /usr/local/share/ca-certificates/" in text
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in text
    with pytest.raises(ValueError, match="'ca_certificates' must be"):
        render.BuildOptions("pytorch", "1.13.1", ca_certificates=[tmp_path / "key.pem"])


def test_unknown_versions_and_bad_options_are_refused():
    with pytest.raises(ImageError, match=r"known: 1\.10\.0, 1\.10\.2, .*, 2\.0\.1\)?$"):
        render.render_dockerfile(render.BuildOptions("pytorch", "2.1.0", "gpu"))
    with pytest.raises(ValueError, match="'processor' must be in"):
        render.BuildOptions("pytorch", "1.13.1", "tpu")
    with pytest.raises(ValueError, match="'framework' must be in"):
        render.BuildOptions("mxnet", "1.9.0")
    with pytest.raises(ValueError, match="'base' must match"):
        render.BuildOptions("pytorch", "1.13.1", base="ubuntu; rm -rf /")
    with pytest.raises(ValueError, match="'python' must match"):
        render.BuildOptions("pytorch", "1.13.1", python="2.7")


def test_templates_are_strict_about_missing_variables():
    context = render.template_context(render.BuildOptions("pytorch", "1.13.1", "gpu"))
    del context["nccl_version"]
    template = render.environment().get_template("pytorch.Dockerfile.j2")
    with pytest.raises(jinja2.UndefinedError, match="nccl_version"):
        template.render(**context)


def test_fragments_are_shared_not_copied():
    """The MPI, EFA, SSH and runtime layers live in one fragment each."""
    for name in ("pytorch.Dockerfile.j2", "tensorflow.Dockerfile.j2"):
        source = (render.TEMPLATES_DIR / name).read_text()
        assert '{% extends "base.Dockerfile.j2" %}' in source
        for marker in ("openmpi", "efa_installer", "ssh-keygen", "pip wheel"):
            assert marker not in source


def instructions(text):
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            logical.append(current)
            current = ""
    return [tuple(entry.split(None, 1)) for entry in logical]


@pytest.mark.parametrize("spec,processor", ALL, ids=IDS)
def test_every_run_step_is_valid_shell_and_every_instruction_known(spec, processor):
    """GPU images cannot be built here: at least every RUN must parse in /bin/sh."""
    text = render.render_dockerfile(options(spec, processor, ca_certificates=["x.crt"]))
    known = {"FROM", "RUN", "ENV", "COPY", "LABEL", "WORKDIR", "ENTRYPOINT", "CMD"}
    steps = instructions(text)
    assert {name for name, _ in steps} <= known
    for name, body in steps:
        if name == "RUN":
            done = subprocess.run(["sh", "-n", "-c", body], capture_output=True, text=True)
            assert done.returncode == 0, (body, done.stderr)
        if name in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(body), list)


INFERENCE = [(spec, processor) for framework in ("pytorch", "tensorflow")
             for spec in matrix.specs(framework) for processor in matrix.PROCESSORS]
INSTALLS = {"pytorch": lambda spec, processor: f'"torch=={spec.framework_version}+',
            "tensorflow": lambda spec, processor: (
                f'"{"tensorflow" if processor == "gpu" else "tensorflow-cpu"}=='
                f'{spec.framework_version}"')}


@pytest.mark.parametrize("spec,processor", INFERENCE,
                         ids=[f"{s.framework}-{s.framework_version}-{p}" for s, p in INFERENCE])
def test_inference_images_serve_without_the_training_stack(spec, processor):
    opts = options(spec, processor, scope="inference")
    text = render.render_dockerfile(opts)
    assert opts.local_name == f"shoal-{spec.framework}-inference:{spec.tag(processor)}"
    assert [name for _, name in stages(text)] == ["system", "builder", "final"]
    final = stage_body(text, "final")
    system = stage_body(text, "system").lower()
    for training_only in ("openmpi", "efa", "ssh", "nccl", "mpirun"):
        assert training_only not in final.lower() and training_only not in system
    assert 'CMD ["serve"]' in final and "EXPOSE 8080" in final
    assert "ENV SAGEMAKER_BIND_TO_PORT=8080" in final
    assert "test -x /opt/shoal/venv/bin/serve" in final
    assert INSTALLS[spec.framework](spec, processor) in final
    assert f"ENV SHOAL_MODEL_SERVER_FRAMEWORK={spec.framework}" in final
    known = {"FROM", "RUN", "ENV", "COPY", "LABEL", "WORKDIR", "ENTRYPOINT", "CMD", "EXPOSE"}
    for name, body in instructions(text):
        assert name in known
        if name == "RUN":
            assert subprocess.run(["sh", "-n", "-c", body]).returncode == 0, body


def test_inference_images_are_named_beside_the_training_ones():
    spec = matrix.find("pytorch", "2.0.1")
    assert spec.repository("inference") == "shoal-pytorch-inference"
    assert matrix.image_uri(spec, "gpu", "111122223333", "us-west-2", "inference") == (
        "111122223333.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-inference:2.0.1-gpu-py310")
    with pytest.raises(ValueError, match="'scope' must be in"):
        spec.repository("serving")
    assert matrix.find("tensorflow", "2.13.0").repository("inference") == \
        "shoal-tensorflow-inference"
    assert render.inference_frameworks() == ["pytorch", "tensorflow"]
