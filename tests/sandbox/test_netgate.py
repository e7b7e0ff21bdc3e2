"""Network destinations: how they are written, and which a policy refuses (the rule the gate applies at each
connection; the gate itself is tried with real commands in tests/security/test_sandbox_network.py)."""

from __future__ import annotations

import ipaddress

import pytest

from rlctl.sandbox.errors import DestinationError
from rlctl.sandbox.netgate import NetworkPolicy, embedded_ipv4, parse_allowed_ranges, parse_destination


def test_destinations_are_checked_with_stable_codes() -> None:
    for bad in (
        "example.com",
        "example.com:0",
        "example.com:65536",
        "*.example.com:443",
        "ex ample.com:80",
        "::1:80",
        "[::1]80",
        "300.1.1.1:80",
        "http://example.com:80",
        "a" * 300 + ":1",
    ):
        with pytest.raises(DestinationError) as error:
            parse_destination(bad)
        assert error.value.code == "NETWORK_DESTINATION_INVALID", bad
    assert str(parse_destination("API.Example.COM.:443")) == "api.example.com:443"
    assert str(parse_destination("[0:0::1]:8080")) == "[::1]:8080"
    strict = NetworkPolicy(())
    open_loopback = NetworkPolicy((), parse_allowed_ranges("127.0.0.0/8, 169.254.0.0/16, 10.0.0.0/8"))
    assert strict.refusal(parse_destination("api.example.com:443")) is None
    assert strict.refusal(parse_destination("93.184.216.34:443")) is None
    for private in (
        "127.0.0.1:80",
        "localhost:80",
        "10.1.2.3:5432",
        "192.168.1.1:80",
        "[::1]:80",
        "[fd00::1]:80",
        "100.64.0.1:80",
        "169.254.1.1:80",
    ):
        assert "RLCTL_SANDBOX_NETWORK_ALLOW" in (strict.refusal(parse_destination(private)) or ""), private
    assert open_loopback.refusal(parse_destination("127.0.0.1:80")) is None
    assert open_loopback.refusal(parse_destination("10.1.2.3:5432")) is None
    for never in (
        "169.254.169.254:80",
        "[fd00:ec2::254]:80",
        "metadata.google.internal:80",
        "0.0.0.0:80",
        "224.0.0.1:80",
        "[::ffff:169.254.169.254]:80",
    ):
        assert "never" in (open_loopback.refusal(parse_destination(never)) or ""), never


def test_ipv6_addresses_carrying_an_ipv4_one_get_the_ipv4_rule() -> None:
    """NAT64, IPv4-compatible, -mapped and -translated, 6to4 and Teredo addresses reach the IPv4 address they
    carry wherever a translator or relay forwards them: the loopback, private and metadata ones are refused."""
    forms = {
        "64:ff9b::{hi}:{lo}": "NAT64",
        "::{hi}:{lo}": "IPv4-compatible",
        "::ffff:{hi}:{lo}": "IPv4-mapped",
        "::ffff:0:{hi}:{lo}": "IPv4-translated",
        "2002:{hi}:{lo}::1": "6to4",
    }
    strict = NetworkPolicy(())
    for form, name in forms.items():
        for ipv4, expected in (
            ("127.0.0.1", "RLCTL_SANDBOX_NETWORK_ALLOW"),
            ("10.1.2.3", "RLCTL_SANDBOX_NETWORK_ALLOW"),
            ("169.254.169.254", "never"),
        ):
            packed = ipaddress.IPv4Address(ipv4).packed
            text = form.format(hi=packed[:2].hex(), lo=packed[2:].hex())
            address = ipaddress.IPv6Address(text)
            assert ipaddress.IPv4Address(ipv4) in embedded_ipv4(address), (name, text)
            refusal = strict.refusal(parse_destination(f"[{address}]:80"))
            assert refusal is not None and expected in refusal and ipv4 in refusal, (name, text, refusal)
        public = form.format(hi="5db8", lo="d822")  # 93.184.216.34
        assert strict.refusal(parse_destination(f"[{ipaddress.IPv6Address(public)}]:443")) is None, name
    # The local-use NAT64 prefix may be used at /48, /56, /64 or /96 (bits 64-71 skipped): the network chooses,
    # so every reading must be a reachable address.
    local_use = (
        "64:ff9b:1:a9fe:a9:fe00::",
        "64:ff9b:1:a9:fe:a9fe::",
        "64:ff9b:1:0:a9:fea9:fe00:0",
        "64:ff9b:1::a9fe:a9fe",
    )
    for text in local_use:
        assert ipaddress.IPv4Address("169.254.169.254") in embedded_ipv4(ipaddress.IPv6Address(text)), text
        assert strict.refusal(parse_destination(f"[{text}]:80")) is not None, text
    # Teredo: the server's and the client's (obfuscated) addresses are both carried.
    teredo = ipaddress.IPv6Address("2001:0:a00:1:8000:63bf:80ff:fffe")  # server 10.0.0.1, client 127.0.0.1
    assert embedded_ipv4(teredo) == (ipaddress.IPv4Address("10.0.0.1"), ipaddress.IPv4Address("127.0.0.1"))
    assert "RLCTL_SANDBOX_NETWORK_ALLOW" in (strict.refusal(parse_destination(f"[{teredo}]:80")) or "")
    # Allowing the IPv4 range allows the forms that carry it; metadata stays refused.
    allowed = NetworkPolicy((), parse_allowed_ranges("127.0.0.0/8"))
    assert allowed.refusal(parse_destination("[64:ff9b::7f00:1]:80")) is None
    assert embedded_ipv4(ipaddress.IPv6Address("::1")) == () and embedded_ipv4(ipaddress.IPv4Address("1.2.3.4")) == ()
