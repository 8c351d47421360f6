"""The keepalive over real loopback sockets: a websockets server that pings faster than the owner's long call
lasts, and gives up on a late pong (its ``ping_interval`` and ``ping_timeout``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from ws_servers import binary_frame, echo

from plugrl_env_client.websocket import client as ws_client
from plugrl_env_client.websocket.common import WebSocketClosed
from plugrl_env_client.websocket.keepalive import Keepalive

PINGS = {"ping_interval": 0.5, "ping_timeout": 0.5}
"""A server that closes (1011) a connection whose pong is more than 0.5 s late; a long call below lasts 2.5 s."""


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.slow
def test_without_the_keepalive_a_long_call_loses_the_connection(bare):
    """The check that the next test can fail."""
    client = ws_client.connect(bare(echo, **PINGS))
    try:
        time.sleep(2.5)  # an env call that does not return for longer than the ping interval plus its timeout
        with pytest.raises(WebSocketClosed) as info:
            client.send_frame(binary_frame(b"still there?"))
            client.recv(timeout=10)
        assert info.value.code == 1011  # websockets: "keepalive ping timeout"
    finally:
        client.close()


@pytest.mark.slow
def test_the_keepalive_answers_pings_through_a_long_call_and_hands_the_socket_back(bare):
    client = ws_client.connect(bare(echo, **PINGS))
    keepalive = Keepalive([client], grace_s=0.2)
    try:
        client.send_frame(binary_frame(b"before"))
        assert client.recv(timeout=10) == b"before"
        with keepalive:
            time.sleep(2.5)  # the long env call
        assert keepalive.takeovers == 1 and not client.lent
        client.send_frame(binary_frame(b"after"))
        assert client.recv(timeout=10) == b"after"
    finally:
        keepalive.close()
        client.close()


def test_short_calls_never_involve_the_keepalives_thread(bare):
    client = ws_client.connect(bare(echo))
    keepalive = Keepalive([client], grace_s=0.5)
    try:
        for _ in range(300):
            with keepalive:
                client_is_free = not client.lent
            assert client_is_free
            client.send_frame(binary_frame(b"x"))
            assert client.recv(timeout=10) == b"x"
        assert keepalive.takeovers == 0
    finally:
        keepalive.close()
        client.close()


def test_messages_the_keepalive_reads_during_a_call_wait_for_the_owner_in_order(bare):
    sent = threading.Event()

    def handler(ws):
        ws.recv()
        assert ws.ping().wait(10)  # answered only if someone services the client during the call
        ws.send(b"one")
        ws.send(b"two")
        sent.set()
        ws.recv()

    client = ws_client.connect(bare(handler, ping_interval=None))
    keepalive = Keepalive([client], grace_s=0.1)
    try:
        client.send_frame(binary_frame(b"go"))
        with keepalive:
            assert sent.wait(10)  # the call lasts until the server has pinged and sent
            assert wait_for(lambda: keepalive.takeovers == 1)
            with pytest.raises(RuntimeError, match="serviced by its keepalive"):  # the owner must keep out
                client.recv(timeout=0)
            with pytest.raises(RuntimeError, match="serviced by its keepalive"):
                client.send_frame(binary_frame(b"too early"))
        assert client.recv(timeout=10) == b"one"
        assert client.recv(timeout=10) == b"two"
        client.send_frame(binary_frame(b"done"))
    finally:
        keepalive.close()
        client.close()


def test_a_close_during_a_long_call_is_raised_after_it(bare):
    def handler(ws):
        ws.recv()
        ws.close(1001, "plugrl-server-stop")

    client = ws_client.connect(bare(handler))
    keepalive = Keepalive([client], grace_s=0.1)
    try:
        client.send_frame(binary_frame(b"x"))
        with keepalive:
            assert wait_for(lambda: keepalive.takeovers == 1 and client.closed)
        with pytest.raises(WebSocketClosed) as info:
            client.recv(timeout=10)
        assert (info.value.code, info.value.reason) == (1001, "plugrl-server-stop")
    finally:
        keepalive.close()
        client.close()


def test_a_call_that_raises_still_gets_the_socket_back(bare):
    client = ws_client.connect(bare(echo, **PINGS))
    keepalive = Keepalive([client], grace_s=0.1)
    try:
        with pytest.raises(ZeroDivisionError):
            with keepalive:
                assert wait_for(lambda: keepalive.takeovers == 1)
                raise ZeroDivisionError  # the env failed mid-call
        assert not client.lent
        client.send_frame(binary_frame(b"after"))
        assert client.recv(timeout=10) == b"after"
    finally:
        keepalive.close()
        client.close()


@pytest.mark.slow
def test_several_clients_and_a_replaced_one(bare):
    """A pipelined loop's connections are serviced together; after a reconnect the new one replaces the old."""
    url = bare(echo, **PINGS)
    first, second = ws_client.connect(url), ws_client.connect(url)
    keepalive = Keepalive([first, second], grace_s=0.2)
    try:
        with keepalive:
            time.sleep(2.0)
        first.close()
        third = ws_client.connect(url)
        keepalive.discard(first)
        keepalive.add(third)
        with keepalive:
            time.sleep(2.0)
        assert keepalive.takeovers == 2
        for client in (second, third):
            client.send_frame(binary_frame(b"alive"))
            assert client.recv(timeout=10) == b"alive"
        third.close()
    finally:
        keepalive.close()
        second.close()


def test_close_stops_the_thread(bare):
    client = ws_client.connect(bare(echo))
    keepalive = Keepalive([client], grace_s=0.05)
    with keepalive:
        assert wait_for(lambda: keepalive.takeovers == 1)
    threads = [t for t in threading.enumerate() if t.name == "plugrl-keepalive"]
    assert threads
    keepalive.close()
    assert not any(t.is_alive() for t in threads)
    client.send_frame(binary_frame(b"still mine"))
    assert client.recv(timeout=10) == b"still mine"
    client.close()


@pytest.mark.slow
def test_calls_that_end_as_the_grace_runs_out_never_share_the_client(bare):
    """Calls lasting about the grace period, so that the thread's takeover and the owner's return meet again and
    again: the client is always the owner's after the call (an overlap would raise, or break the echo)."""
    client = ws_client.connect(bare(echo))
    keepalive = Keepalive([client], grace_s=0.005)
    try:
        for i in range(300):
            with keepalive:
                time.sleep(0.004 + 0.002 * (i % 3) / 2)  # 4, 5 and 6 ms: before, at and after the grace
            assert not client.lent
            client.send_frame(binary_frame(b"%d" % i))
            assert client.recv(timeout=10) == b"%d" % i
        assert 0 < keepalive.takeovers < 300
    finally:
        keepalive.close()
        client.close()


def test_a_frame_held_for_the_next_one_goes_out_when_a_long_call_comes_between(bare):
    """A pipelined feedback waits for its infer; an env call between the two that runs long (a slow reset) makes
    it wait no longer than the grace: the keepalive writes it when it takes the socket over."""
    got = threading.Event()

    def handler(ws):
        for message in ws:
            if message == b"feedback":
                got.set()

    client = ws_client.connect(bare(handler))
    keepalive = Keepalive([client], grace_s=0.1)
    try:
        client.send_frame(binary_frame(b"feedback"), more=True)
        with keepalive:  # the slow reset: it returns once the server has the feedback (or after 10 s)
            arrived = got.wait(10)
        assert arrived and keepalive.takeovers == 1
    finally:
        keepalive.close()
        client.close()
