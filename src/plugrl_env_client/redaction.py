"""Secrets out of everything a run shows or writes: the API key and the password of a server URL.

A run needs both to connect, and must never put either into its run folder (``client_config.json``, manifests,
summaries, logs), onto the terminal, or into what a cluster records about it (Ray's job metadata). Every place
that shows a command line, a URL or a message that may hold one passes it through this module, so there is one
rule for what is a secret and one way of hiding it: the value becomes :data:`REDACTED`.

* a URL's password: ``ws://user:pass@host:8000`` shows as ``ws://user:***@host:8000`` (the user name stays: it
  says which account connected);
* a URL's user info without a password: ``ws://TOKEN@host`` shows as ``ws://***@host`` (services that take a
  token as the user name, as many do, get no password field);
* the value of ``--api-key`` in both spellings (``--api-key KEY``, ``--api-key=KEY``; ``--api_key`` too, which
  the parser accepts as well);
* in any text (an exception's message from a library, a log line, a traceback): the value after ``Api-Key``, every
  key in :data:`KEY_VARIABLES` of this process's environment, and every key a command resolved and passed to
  :func:`add_secret`. Every place that writes a text that did not come from this package (the log's handlers, the
  summaries' process errors, a command's one-line error) passes it through :func:`redact_text`.

This module is the bottom of the package: it imports nothing of it, so every layer may use it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
"""What a secret is replaced with."""

SECRET_FLAGS = ("--api-key",)
"""Flags whose value is a secret (spelled with '-'; '_' in their names is matched as well)."""

_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*:)[^\s/?#'\"]*@")
"""A URL's ``scheme://user:`` and its password up to the last ``@`` of the authority (a password may hold a
raw ``@``; urllib splits at the last one too)."""

_URL_TOKEN = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@:'\"]+@")
"""A URL's ``scheme://`` and user info without a colon (a token given as the user name) up to its ``@``."""


KEY_VARIABLES = ("PLUGRL_API_KEY", "PLUGRL_SERVER_API_KEY")
"""Environment variables that hold an API key: their values are secrets wherever they show."""

_API_KEY_HEADER = re.compile(r"(?P<head>\bApi-Key[ \t]+)(?!<)[^\s'\";,)\]]+")
"""``Api-Key <key>``: an Authorization header's value, as a library's error may quote it (a placeholder in angle
brackets, as in a hint, stays)."""

MIN_SECRET = 6
"""Shorter values are not hidden by value (they would hide every such word of a text); ``Api-Key <key>`` still is."""

_secrets: set[str] = set()


def add_secret(value: str | None) -> None:
    """Hide ``value`` (an API key given on the command line) in every text :func:`redact_text` sees from now on."""
    if value:
        _secrets.add(value)


def _known_secrets() -> list[str]:
    """The secrets to hide: the ones added, and the keys of :data:`KEY_VARIABLES` set now; each also with its
    surrounding whitespace and control characters stripped (a key file's CR LF), longest first."""
    found = set(_secrets)
    found.update(v for v in (os.environ.get(name) for name in KEY_VARIABLES) if v)
    found.update({v.strip() for v in found})
    return sorted((v for v in found if len(v) >= MIN_SECRET), key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` with its password replaced (``ws://user:***@host:port``), or its user info when it has no password
    (``ws://***@host:port``); a URL without user info is returned as it is."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # e.g. a port that is no number: still a URL whose password must not show
        return redact_text(url)
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    if password is None:
        return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def redact_text(text: str) -> str:
    """``text`` (a message, an error, a log line) with the password of every URL in it replaced, the user info of
    every URL that has no password, every API key this process knows (:func:`add_secret`, :data:`KEY_VARIABLES`)
    and the value after every ``Api-Key``."""
    for secret in _known_secrets():
        for shown in (secret, repr(secret)[1:-1]):  # as it is, and as a repr() shows it (a CR as \r)
            text = text.replace(shown, REDACTED)
    text = _API_KEY_HEADER.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)
    return _URL_TOKEN.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose lines, tracebacks included, pass through :func:`redact_text`: an exception's text from
    a library (which may quote a header with the API key, or a URL with its password) reaches no log unredacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to record or show: the values of :data:`SECRET_FLAGS` replaced (``--api-key ***``,
    ``--api-key=***``), and the password of every URL in an argument (``--server-url ws://user:***@host``)."""
    out: list[str] = []
    secret_next = False
    for arg in argv:
        if secret_next:
            out.append(REDACTED)
            secret_next = False
            continue
        name, eq, _value = arg.partition("=")
        if _is_secret_flag(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                secret_next = True
            continue
        out.append(redact_text(arg))
    return out


def hide_secrets_of_this_process() -> bool:
    """Redact this process's own command line, as Python and as the OS show it; whether the OS's view changed.

    ``sys.argv`` becomes :func:`redact_argv`'s. The OS's view (``/proc/<pid>/cmdline``: what ``ps`` shows every
    user of the machine, and what Ray records as a driver's job entrypoint) is the process's original argument
    memory: each secret in it is overwritten in place with as many ``*`` (the arguments keep their sizes, so the
    kernel's view keeps its shape). Linux only; elsewhere only ``sys.argv`` changes. Python has its own copies of
    the arguments, so the overwritten memory is read by nothing else.
    """
    sys.argv[:] = redact_argv(sys.argv)
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # proc(5): arg_start and arg_end, fields 48 and 49
    except (OSError, IndexError, ValueError):
        return False
    if not 0 < start < end:
        return False
    raw = ctypes.string_at(start, end - start)
    if raw != Path("/proc/self/cmdline").read_bytes():  # not the plain argument block: leave it alone
        return False
    args = raw[:-1].split(b"\0") if raw.endswith(b"\0") else raw.split(b"\0")
    try:
        texts = [a.decode() for a in args]
    except UnicodeDecodeError:
        return False
    masked = [_masked(a, r) for a, r in zip(texts, redact_argv(texts), strict=True)]
    if masked == texts:
        return False
    block = b"\0".join(m.encode() for m in masked) + (b"\0" if raw.endswith(b"\0") else b"")
    if len(block) != len(raw):
        return False
    ctypes.memmove(start, block, len(block))
    return True


def _masked(arg: str, shown: str) -> str:
    """``arg`` with what :func:`redact_argv` hid in it (the stretch between what ``arg`` and ``shown`` have in
    common at both ends) overwritten with as many ``*``, so that it keeps its length."""
    if arg == shown:
        return arg
    head = 0
    while head < min(len(arg), len(shown)) and arg[head] == shown[head]:
        head += 1
    tail = 0
    while tail < min(len(arg), len(shown)) - head and arg[-1 - tail] == shown[-1 - tail]:
        tail += 1
    return arg[:head] + "*" * (len(arg) - head - tail) + arg[len(arg) - tail:]


def _is_secret_flag(arg: str) -> bool:
    return arg.startswith("--") and "--" + arg[2:].replace("_", "-") in SECRET_FLAGS


__all__ = ["KEY_VARIABLES", "REDACTED", "SECRET_FLAGS", "RedactingFormatter", "add_secret", "hide_secrets_of_this_process", "redact_argv",
           "redact_text", "redact_url"]
