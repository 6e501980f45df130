"""Rendering of Shoal's training-image Dockerfiles from the jinja2 templates in
``templates/`` and the version matrix: pure functions from build options to text."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

import attrs
import jinja2
from shoal.containers import matrix
from shoal.errors import ImageError

TEMPLATES_DIR = Path(__file__).with_name("templates")
FRAMEWORKS = ("pytorch", "tensorflow")

VENV = "/opt/shoal/venv"
MPI_PREFIX = "/opt/amazon/openmpi"
EFA_PREFIX = "/opt/amazon/efa"
SSH_PORT = 22


def _shoal_version() -> str:
    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@attrs.frozen
class BuildOptions:
    """What to build: one matrix entry, a processor, and the overrides a local build needs."""

    framework: str = attrs.field(validator=attrs.validators.in_(FRAMEWORKS))
    framework_version: str = attrs.field(validator=attrs.validators.matches_re(r"\d+\.\d+(\.\d+)?"))
    processor: str = attrs.field(default="gpu", validator=attrs.validators.in_(matrix.PROCESSORS))
    # Base image instead of the matrix's (e.g. a locally made Debian for tests).
    base: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.matches_re(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")))
    # Python to install: "3.9" -> python3.9 packages, "3" -> the distribution's python3.
    python: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.matches_re(r"3(\.\d{1,2})?")))
    install_framework: bool = True
    # training: `train`, MPI, NCCL/EFA, SSH; inference: the model server (`serve`, port 8080)
    scope: str = attrs.field(default="training", validator=attrs.validators.in_(matrix.SCOPES))
    shoal_version: str = attrs.field(factory=_shoal_version)
    # Extra CA certificates (PEM, *.crt) the build trusts, e.g. a TLS-inspecting proxy's.
    ca_certificates: tuple[Path, ...] = attrs.field(
        default=(), converter=lambda paths: tuple(Path(p) for p in paths))

    @ca_certificates.validator
    def _check_certificates(self, attribute, value):
        for path in value:
            if path.suffix != ".crt":
                raise ValueError(f"'{attribute.name}' must be *.crt files (got {str(path)!r})")

    @property
    def spec(self) -> matrix.ImageSpec:
        spec = matrix.find(self.framework, self.framework_version)
        if spec is None:
            known = ", ".join(s.framework_version for s in matrix.specs(self.framework))
            raise ImageError(
                f"no {self.framework} {self.framework_version} image in the matrix (known: {known})")
        return spec

    @property
    def base_image(self) -> str:
        if self.base:
            return self.base
        return self.spec.gpu_base if self.processor == "gpu" else self.spec.cpu_base

    @property
    def python_version(self) -> str:
        return self.python or self.spec.python

    @property
    def local_name(self) -> str:
        """The image's name in the local store (buildah files it under localhost/): the
        repository and tag it is pushed as, and the name local-mode jobs run."""
        return f"{self.spec.repository(self.scope)}:{self.spec.tag(self.processor)}"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """Templates with StrictUndefined: a variable the context lacks is an error, not ''."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Dockerfiles, not HTML
    )


def _python_packages(python: str, *suffixes: str) -> list[str]:
    return [f"python{python}{suffix}" for suffix in suffixes]


def labels(options: BuildOptions) -> dict[str, str]:
    """The image's version labels."""
    spec = options.spec
    out = {
        "ai.shoal.version": options.shoal_version,
        "ai.shoal.framework": spec.framework,
        "ai.shoal.framework-version": spec.framework_version,
        "ai.shoal.framework-installed": str(options.install_framework).lower(),
        "ai.shoal.processor": options.processor,
        "ai.shoal.python": options.python_version,
        "ai.shoal.py-version": spec.py_version,
    }
    if options.processor == "gpu":
        out["ai.shoal.cuda"] = spec.cuda
    if options.processor == "gpu" and options.scope == "training":  # the comms stack
        tools = spec.toolchain()
        out.update({
            "ai.shoal.nccl": spec.nccl,
            "ai.shoal.openmpi": tools["openmpi"],
            "ai.shoal.efa-installer": tools["efa"],
            "ai.shoal.aws-ofi-nccl": tools["aws_ofi_nccl"],
        })
    return out


def template_context(options: BuildOptions) -> dict:
    """Every variable the templates use, from the options and the matrix."""
    spec, python = options.spec, options.python_version
    tools = spec.toolchain()
    gpu = options.processor == "gpu"
    return {
        "template_name": template_name(options),
        "framework": spec.framework,
        "framework_version": spec.framework_version,
        "processor": options.processor,
        "py_version": spec.py_version,
        "python": python,
        "base_image": options.base_image,
        "cuda": spec.cuda,
        "cuda_tag": spec.cuda_tag,
        "nccl_version": spec.nccl,
        "openmpi_version": tools["openmpi"],
        "efa_version": tools["efa"],
        "aws_ofi_nccl_version": tools["aws_ofi_nccl"],
        "shoal_version": options.shoal_version,
        "install_framework": options.install_framework,
        "repository": spec.repository(options.scope),
        "scope": options.scope,
        "serving_port": 8080,
        "tag": spec.tag(options.processor),
        "labels": labels(options),
        "venv": VENV,
        "mpi_prefix": MPI_PREFIX,
        "efa_prefix": EFA_PREFIX,
        "mpirun": f"{MPI_PREFIX}/bin/mpirun" if gpu else "/usr/bin/mpirun",
        "mca_params": (f"{MPI_PREFIX}/etc/openmpi-mca-params.conf" if gpu
                       else "/etc/openmpi/openmpi-mca-params.conf"),
        "ssh_port": SSH_PORT,
        "ca_certificates": [path.name for path in options.ca_certificates],
        "build_src": "/opt/shoal/src",
        # The CUDA 11 era frameworks are built against NumPy 1: keep Shoal's deps there too.
        "runtime_pins": ["numpy<2"] if options.install_framework else [],
        "deps": "/opt/shoal/deps",
        "wheels": "/opt/shoal/wheels",
        "build_lib": "/opt/shoal/lib",
        "gpu_packages": [
            "build-essential", "ca-certificates", "curl", "wget", "git", "autoconf", "automake",
            "libtool", "pkg-config", "hwloc", "libhwloc-dev", "libnuma1", "libnuma-dev",
            "libibverbs-dev", "zlib1g-dev", "jq", "unzip", "openssh-client", "openssh-server",
            "procps", "iproute2", *_python_packages(python, "", "-venv", "-dev"),
        ],
        "cpu_packages": [
            "ca-certificates", "curl", "openmpi-bin", "openssh-client", "openssh-server",
            "procps", "iproute2", *_python_packages(python, "", "-venv"),
        ],
        # the model server needs no MPI or SSH; the builder compiles Shoal's core as ever
        "inference_packages": ["ca-certificates", "curl", "procps",
                               *_python_packages(python, "", "-venv")],
        "inference_build_packages": ["build-essential", "libopenmpi-dev",
                                     *_python_packages(python, "-dev")],
        "cpu_build_packages": [
            "build-essential", "libopenmpi-dev", *_python_packages(python, "-dev"),
        ],
    }


def template_name(options: BuildOptions) -> str:
    if options.scope == "inference":
        name = f"{options.framework}-inference.Dockerfile.j2"
        if not (TEMPLATES_DIR / name).exists():
            raise ImageError(f"no {options.framework} inference image yet (inference images: "
                             f"{', '.join(inference_frameworks())})")
        return name
    return f"{options.framework}.Dockerfile.j2"


def inference_frameworks() -> list[str]:
    return sorted(p.name.split("-inference")[0] for p in TEMPLATES_DIR.glob("*-inference.*"))


def render_dockerfile(options: BuildOptions) -> str:
    """The Dockerfile for these options."""
    return environment().get_template(template_name(options)).render(**template_context(options))

