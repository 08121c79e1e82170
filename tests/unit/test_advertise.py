"""daemon.config.advertise: the address a node advertises when its hostname is loopback."""

from __future__ import annotations

import pytest

from daemon.config import advertise
from daemon.config.advertise import EtcdUnresolved, choose, source_address
from trainer.config import ConfigError

REMOTE_ETCD = "192.0.2.1:2379"  # TEST-NET-1: routed like any remote address, never dialled


def _route_source() -> str | None:
    return source_address("192.0.2.1", 2379)


def test_an_embedded_or_loopback_etcd_changes_nothing() -> None:
    """Every node on one machine (the demo, the tests): 127.0.0.1 is right for all."""
    assert choose("127.0.0.1", explicit=False, endpoints=[]) is None
    assert choose("localhost", explicit=False, endpoints=["127.0.0.1:2379"]) is None
    assert choose("127.0.0.1", explicit=True, endpoints=["localhost:2379"]) is None


def test_an_address_that_is_not_loopback_is_kept() -> None:
    address = _route_source()
    if address is None:
        pytest.skip("this machine has no route besides loopback")
    assert choose(address, explicit=False, endpoints=[REMOTE_ETCD]) is None


def test_a_loopback_hostname_with_a_remote_etcd_advertises_the_route_to_etcd() -> None:
    address = _route_source()
    if address is None:
        pytest.skip("this machine has no route besides loopback")
    choice = choose("localhost", explicit=False, endpoints=[REMOTE_ETCD])
    assert choice is not None and choice.address == address
    assert "resolves to loopback" in choice.reason and REMOTE_ETCD in choice.reason
    # A loopback etcd endpoint before the remote one does not hide it.
    again = choose("localhost", explicit=False, endpoints=["127.0.0.1:2379", REMOTE_ETCD])
    assert again is not None and again.address == address


def test_a_specific_bind_host_is_advertised_before_the_route() -> None:
    choice = choose("localhost", False, [REMOTE_ETCD], bind_host="192.0.2.77")
    assert choice is not None and choice.address == "192.0.2.77"
    wildcard = choose("localhost", False, [REMOTE_ETCD], bind_host="0.0.0.0")
    assert wildcard is None or wildcard.address != "0.0.0.0"


def test_an_explicit_loopback_advertise_host_with_a_remote_etcd_is_bad_input() -> None:
    with pytest.raises(ConfigError) as e:
        choose("127.0.0.1", explicit=True, endpoints=[REMOTE_ETCD])
    message = str(e.value)
    assert message.startswith("node.advertise_host '127.0.0.1' is a loopback address")
    assert REMOTE_ETCD in message and message.count(".") >= 1


def test_no_route_to_etcd_is_bad_input_naming_node_advertise_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(advertise, "source_address", lambda address, port: None)
    with pytest.raises(ConfigError, match=r"set\s+node.advertise_host"):
        choose("localhost", explicit=False, endpoints=[REMOTE_ETCD])


def test_an_etcd_name_that_does_not_resolve_is_not_bad_input() -> None:
    """DNS may not be up yet: an OSError (exit 1, retried), not a ConfigError (exit 2)."""
    with pytest.raises(EtcdUnresolved, match=r"etcd\.endpoints"):
        choose("localhost", explicit=False, endpoints=["no-such-host.invalid:2379"])
    assert not issubclass(EtcdUnresolved, ConfigError) and issubclass(EtcdUnresolved, OSError)


def test_the_source_address_of_a_loopback_destination_is_none() -> None:
    assert source_address("127.0.0.1", 2379) is None
