"""Network destinations: how they are written, and which a policy refuses (the rule the gate applies at each
connection; the gate itself is tried with real commands in tests/security/test_sandbox_network.py)."""

from __future__ import annotations

import pytest

from rlctl.sandbox.errors import DestinationError
from rlctl.sandbox.netgate import NetworkPolicy, parse_allowed_ranges, parse_destination


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
