"""Emulated links between namespaced hosts: ``SHOAL_LOCAL_LINK="rate=10gbit,delay=50us"``.

Parsed once, as data, into a ``LinkSpec`` whose validators carry the limits. A rate is
emulated with a token-bucket filter (``tbf``) on each host's ``eth0``; a delay needs the
kernel's ``netem`` qdisc, which some kernels lack: :func:`qdisc_commands` then says so
instead of leaving the link unshaped. Rates are in bits per second as ``tc`` writes them
(``kbit``, ``mbit``, ``gbit``); delays in ``us`` or ``ms``.
"""

from __future__ import annotations

import re

import attrs

from shoal.errors import ConfigError

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_DELAY_UNITS = {"us": 1.0, "ms": 1000.0}
MAX_RATE = 400 * 10**9  # the fastest instance networks
MAX_DELAY_US = 1_000_000


class LinkError(ConfigError):
    """A link specification that cannot be parsed or emulated here."""


def _positive(instance, attribute, value):
    if value is not None and value <= 0:
        raise LinkError(f"'{attribute.name}' must be > 0 (got {value})")


def _at_most(limit):
    def check(instance, attribute, value):
        if value is not None and value > limit:
            raise LinkError(f"'{attribute.name}' must be <= {limit} (got {value})")
    return check


@attrs.frozen
class LinkSpec:
    rate_bits: int | None = attrs.field(default=None, validator=[_positive, _at_most(MAX_RATE)])
    delay_us: float | None = attrs.field(default=None,
                                         validator=[_positive, _at_most(MAX_DELAY_US)])

    @classmethod
    def parse(cls, text: str | None) -> LinkSpec | None:
        """``"rate=10gbit,delay=50us"`` (either part may be left out); None for no text."""
        if not text or not text.strip():
            return None
        fields: dict[str, object] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep:
                raise LinkError(f"link setting {part.strip()!r} is not key=value")
            if key == "rate":
                match = _RATE.match(value.strip())
                if match is None:
                    raise LinkError(f"'rate' must be a number with bit, kbit, mbit or gbit "
                                    f"(got {value!r})")
                fields["rate_bits"] = int(float(match[1]) * _RATE_UNITS[match[2]])
            elif key == "delay":
                match = _DELAY.match(value.strip())
                if match is None:
                    raise LinkError(f"'delay' must be a number with us or ms (got {value!r})")
                fields["delay_us"] = float(match[1]) * _DELAY_UNITS[match[2]]
            else:
                raise LinkError(f"unknown link setting {key!r} (known: rate, delay)")
        return cls(**fields)

    def describe(self) -> str:
        parts = []
        if self.rate_bits:
            parts.append(f"{self.rate_bits / 1e9:g} Gbit/s")
        if self.delay_us:
            parts.append(f"{self.delay_us:g} us one way")
        return ", ".join(parts) or "unshaped"


def _burst_bytes(rate_bits: int) -> int:
    # enough tokens for one timer tick (about 1 ms) at the rate, and at least 64 KiB
    return max(64 * 1024, rate_bits // 8 // 1000)


def qdisc_commands(spec: LinkSpec, device: str = "eth0", netem: bool = True) -> list[list[str]]:
    """The ``tc`` commands (run inside a host's namespace) that shape ``device``.
    ``netem``: whether this kernel has the netem qdisc (see ``preflight``)."""
    if spec.delay_us and not netem:
        raise LinkError("a link delay needs the kernel's netem qdisc, which this kernel does "
                        "not have ('tc qdisc add ... netem' fails: a kernel built without "
                        "CONFIG_NET_SCH_NETEM); a rate alone works (tbf)")
    commands = []
    if spec.delay_us:
        netem_args = ["delay", f"{spec.delay_us:g}us"]
        if spec.rate_bits:
            netem_args += ["rate", f"{spec.rate_bits}bit"]
        commands.append(["tc", "qdisc", "replace", "dev", device, "root", "netem", *netem_args])
    elif spec.rate_bits:
        commands.append(["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate",
                         f"{spec.rate_bits}bit", "burst", str(_burst_bytes(spec.rate_bits)),
                         "latency", "10ms"])
    return commands
