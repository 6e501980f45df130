"""Emulated links: the specification parsed as data with its limits, and the qdiscs it
becomes (tbf for a rate; netem for a delay, refused where the kernel has none)."""

from __future__ import annotations

import pytest
from shoal.local.network.links import LinkError, LinkSpec, qdisc_commands


@pytest.mark.parametrize("text, rate, delay", [
    ("rate=10gbit,delay=50us", 10 * 10**9, 50.0),
    ("rate=2.5gbit", 2_500_000_000, None),
    ("delay=1.5ms", None, 1500.0),
    (" rate=100mbit , delay=20us ", 100 * 10**6, 20.0),
])
def test_a_link_is_parsed_into_bits_and_microseconds(text, rate, delay):
    assert LinkSpec.parse(text) == LinkSpec(rate, delay)


@pytest.mark.parametrize("text", [None, "", "   "])
def test_no_text_is_no_link(text):
    assert LinkSpec.parse(text) is None


@pytest.mark.parametrize("text, message", [
    ("rate=10gbps", "'rate' must be a number with bit, kbit, mbit or gbit (got '10gbps')"),
    ("delay=5s", "'delay' must be a number with us or ms (got '5s')"),
    ("loss=1%", "unknown link setting 'loss' (known: rate, delay)"),
    ("rate", "link setting 'rate' is not key=value"),
    ("rate=0gbit", "'rate_bits' must be > 0 (got 0)"),
    ("rate=500gbit", "'rate_bits' must be <= 400000000000 (got 500000000000)"),
    ("delay=2000ms", "'delay_us' must be <= 1000000 (got 2000000.0)"),
])
def test_a_bad_link_says_what_was_wrong(text, message):
    with pytest.raises(LinkError) as error:
        LinkSpec.parse(text)
    assert str(error.value) == message


def test_a_rate_alone_is_a_token_bucket():
    [command] = qdisc_commands(LinkSpec(rate_bits=10 * 10**9), "eth0", netem=False)
    assert command[:7] == ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf"]
    assert command[7:9] == ["rate", "10000000000bit"]
    assert int(command[command.index("burst") + 1]) == 10 * 10**9 // 8 // 1000  # 1 ms of it


def test_a_delay_is_netem_with_the_rate_in_it():
    [command] = qdisc_commands(LinkSpec(10**9, 50.0), "eth0", netem=True)
    assert command[6:] == ["netem", "delay", "50us", "rate", "1000000000bit"]


def test_a_delay_without_netem_is_refused_not_ignored():
    with pytest.raises(LinkError, match="netem"):
        qdisc_commands(LinkSpec(delay_us=50.0), "eth0", netem=False)


def test_describe():
    assert LinkSpec(10 * 10**9, 50.0).describe() == "10 Gbit/s, 50 us one way"
