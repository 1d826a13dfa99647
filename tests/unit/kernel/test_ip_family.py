"""`IpFamily`: the family of an address or network, from a value or its text, never from a `":"`."""
import ipaddress
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


@pytest.mark.parametrize("text", ["10.0.0.1", "10.0.0.0/8", "10.0.0.0/08", "10.0.0.0/255.0.0.0", "0.0.0.0/0", "::1",
                                  "fe80::1%eth0", "fd00::/64", "::ffff:1.2.3.4", "::/0"])
def test_text_is_read_as_ipaddress_reads_it(text):
    try:
        expected = ipaddress.ip_address(text).version
    except ValueError:
        expected = ipaddress.ip_network(text, strict=False).version
    assert IpFamily.of(text).value == expected


@pytest.mark.parametrize("text", ["", "x", "1.2.3", "010.0.0.1", "10.0.0.1/33", "fd00::/129", "10.0.0.0/ 8",
                                  "1.2.3.4/", "10.0.0.1,tcp:80"])
def test_text_that_is_no_address_or_network_is_a_value_error(text):
    with pytest.raises(ValueError):
        IpFamily.of(text)
