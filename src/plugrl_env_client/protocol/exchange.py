"""The exchange on one connection: the order its calls must come in, and how a connection ends.

:class:`Exchange` is where the exchange stands (idle, awaiting a reply, feedback due); a call out of its order raises
a named :class:`ExchangeMisuse`, as Gymnasium's vector envs do for ``step_async``/``step_wait``.

A close is an ordinary event of a long run. Whatever ended the connection (the server's close frame, a dropped
socket, the client giving up on a reply, a server that broke the exchange), the client sees one
:class:`ConnectionLost` carrying a :class:`Closed`: the close's code and reason and the :class:`CloseAction` it
calls for, decided by :func:`classify_close` from the protocol's close table (SPEC.md §6). The caller handles it in
one place: reconnect, or end the run. What reconnecting cannot fix (a text frame, a message that breaks the
protocol's parsers) is a :class:`~plugrl_env_client.errors.ProtocolError` instead.
"""

from __future__ import annotations

import dataclasses
import enum

from plugrl_env_client.protocol import messages

__all__ = [
    "AlreadyAwaitingReply",
    "CloseAction",
    "Closed",
    "ConnectionLost",
    "Exchange",
    "ExchangeMisuse",
    "FeedbackStillDue",
    "NoFeedbackDue",
    "NoReplyAwaited",
    "NotConnected",
    "classify_close",
]


class Exchange(enum.Enum):
    """Where the exchange on one connection stands: PlugRL answers each infer with one action, and one feedback
    answers each action (``infer -> action -> feedback -> infer``, SPEC §2; a fresh connection starts idle, with
    an infer)."""

    IDLE = "idle"  # an infer may go out; a feedback may not
    AWAITING_REPLY = "awaiting a reply"  # an infer is on the wire: its action comes next, nothing goes out
    FEEDBACK_DUE = "feedback due"  # its action came: the feedback on it goes out next, then the exchange is idle

    def check_infer(self) -> None:
        """Raise the named misuse when an infer may not go out now (both wire protocols' sessions ask here)."""
        if self is Exchange.AWAITING_REPLY:
            raise AlreadyAwaitingReply("an infer is already waiting for its reply: receive_actions() first")
        if self is Exchange.FEEDBACK_DUE:
            raise FeedbackStillDue("an infer while the feedback on the last action is still due: feedback() first "
                                   "(one feedback answers each action, SPEC §2)")


class ExchangeMisuse(RuntimeError):
    """A call out of the exchange's order (a bug of the caller, never the server's doing), as Gymnasium's
    ``AlreadyPendingCallError`` and ``NoAsyncCallError`` are for ``step_async``/``step_wait``."""


class AlreadyAwaitingReply(ExchangeMisuse):
    """An infer or a feedback while an infer waits for its reply."""


class NoReplyAwaited(ExchangeMisuse):
    """A reply asked for while no infer waits for one."""


class NoFeedbackDue(ExchangeMisuse):
    """A feedback that answers no reply."""


class FeedbackStillDue(ExchangeMisuse):
    """An infer before the feedback on the last action went out."""


class NotConnected(ExchangeMisuse):
    """The session is used before it was opened."""


class CloseAction(enum.Enum):
    """What the client does after a close."""

    END = "end"  # the run is over: write outputs, exit 0
    RECONNECT = "reconnect"  # drop chunks in flight, open a new connection, start with an infer


@dataclasses.dataclass(frozen=True)
class Closed:
    """A close as the client saw it: code (None without a close frame), reason, and what to do next. ``why`` says
    what happened when the client closed the connection itself (no reply in time, a reply that answered no infer)."""

    action: CloseAction
    code: int | None
    reason: str
    why: str = ""

    def describe(self) -> str:
        if self.why:
            return self.why
        code = "no close frame" if self.code is None else f"code {self.code}"
        return f"{code}, reason {self.reason!r}" if self.reason else code

    @property
    def ends_a_run(self) -> bool:
        """Whether the server said its run is over (whatever the client does about it)."""
        return (self.code == messages.CLOSE_GOING_AWAY and self.reason == messages.REASON_STOP) or (
            self.code == messages.CLOSE_NORMAL and not self.reason and not self.why)


class ConnectionLost(Exception):
    """The connection is closed (by the server, the network, or the client); ``close`` says what to do next."""

    def __init__(self, close: Closed) -> None:
        super().__init__(close.describe())
        self.close = close


def classify_close(code: int | None, reason: str, reconnect_on_stop: bool = False) -> Closed:
    """Map a close (code, reason) to what the client must do, per the protocol's close table."""
    closed = Closed(CloseAction.RECONNECT, code, reason)
    if closed.ends_a_run and not reconnect_on_stop:
        return Closed(CloseAction.END, code, reason)
    return closed
