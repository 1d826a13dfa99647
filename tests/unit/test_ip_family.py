"""`IpFamily`: the family of an address or network, from a value or its text, never from a `":"`."""
from ipaddress import IPv4Address, IPv4Interface, IPv6Network, ip_network

import pytest

from netagent.kernel.families import IpFamily


def test_of_names_the_family_of_addresses_networks_and_their_text():
    assert IpFamily.of("10.0.0.1") is IpFamily.of(IPv4Address("10.0.0.1")) is IpFamily.V4
    assert IpFamily.of("fd00::/64") is IpFamily.of(IPv6Network("fd00::/64")) is IpFamily.V6
    assert IpFamily.of("::ffff:10.0.0.1") is IpFamily.V6
    with pytest.raises(ValueError):
        IpFamily.of("10.0.0.1:80")


def test_holds_says_whether_a_value_is_of_the_family():
    assert IpFamily.V4.holds(ip_network("10.244.0.0/16")) and not IpFamily.V6.holds(ip_network("10.244.0.0/16"))
    assert IpFamily.V6.holds("2001:db8::1") and not IpFamily.V4.holds("2001:db8::/32")
    assert IpFamily.V4.holds(IPv4Interface("10.0.0.1/24"))
