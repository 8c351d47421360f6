"""classify_close: every row of the protocol's closing table, and the --reconnect-on-server-stop switch."""

from __future__ import annotations

import pytest

from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.exchange import CloseAction, Closed, classify_close

END, RECONNECT = CloseAction.END, CloseAction.RECONNECT

TABLE = [
    # (code, reason, action without --reconnect-on-server-stop, action with it)
    pytest.param(1001, "plugrl-server-stop", END, RECONNECT, id="server run finished"),
    pytest.param(1001, "plugrl-server-resync", RECONNECT, RECONNECT, id="server protocol error (resync)"),
    pytest.param(1001, "Feedback timeout", RECONNECT, RECONNECT, id="server feedback timeout"),
    pytest.param(1001, "Server shutdown", RECONNECT, RECONNECT, id="server shutdown by signal"),
    pytest.param(1011, "Internal server error.", RECONNECT, RECONNECT, id="server internal error"),
    pytest.param(1000, "", END, RECONNECT, id="harness passive end (1000, empty)"),
    pytest.param(None, "", RECONNECT, RECONNECT, id="no close frame"),
]


@pytest.mark.parametrize("code, reason, default, on_stop", TABLE)
def test_close_table(code, reason, default, on_stop) -> None:
    assert classify_close(code, reason) == Closed(default, code, reason)
    assert classify_close(code, reason, reconnect_on_stop=False).action is default
    assert classify_close(code, reason, reconnect_on_stop=True) == Closed(on_stop, code, reason)


def test_reason_constants_match_the_table() -> None:
    assert messages.REASON_STOP == "plugrl-server-stop"
    assert messages.REASON_RESYNC == "plugrl-server-resync"
    assert messages.REASON_FEEDBACK_TIMEOUT == "Feedback timeout"
    assert messages.REASON_SHUTDOWN == "Server shutdown"
    assert messages.REASON_INTERNAL == "Internal server error."
    assert (messages.CLOSE_NORMAL, messages.CLOSE_GOING_AWAY, messages.CLOSE_INTERNAL) == (1000, 1001, 1011)


@pytest.mark.parametrize(
    "code, reason",
    [
        (1001, ""),  # going away without a reason: the server may come back
        (1001, "Plugrl-Server-Stop"),  # reasons are compared exactly
        (1001, "plugrl-server-stop "),
        (1000, "plugrl-server-stop"),  # the stop reason only ends the run with code 1001
        (1000, "bye"),  # a normal close with a reason is not the harness's passive end
        (1006, ""),
        (1011, ""),
        (1002, "protocol error"),
        (4000, "plugrl-server-stop"),
    ],
)
def test_anything_else_reconnects(code, reason) -> None:
    assert classify_close(code, reason).action is RECONNECT


def test_describe() -> None:
    assert classify_close(None, "").describe() == "no close frame"
    assert classify_close(1000, "").describe() == "code 1000"
    assert classify_close(1001, "plugrl-server-stop").describe() == "code 1001, reason 'plugrl-server-stop'"
