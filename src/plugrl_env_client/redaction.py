"""Secrets out of everything a run shows or writes: the API key and the password of a server URL.

A run needs both to connect, and must never put either into its run folder (``client_config.json``, manifests,
summaries, logs), onto the terminal, or into what a cluster records about it (Ray's job metadata). Every place
that shows a command line, a URL or a message that may hold one passes it through this module, so there is one
rule for what is a secret and one way of hiding it: the value becomes :data:`REDACTED`.

* a URL's password: ``ws://user:pass@host:8000`` shows as ``ws://user:***@host:8000`` (the user name stays: it
  says which account connected);
* the value of ``--api-key`` in both spellings (``--api-key KEY``, ``--api-key=KEY``; ``--api_key`` too, which
  the parser accepts as well).

This module is the bottom of the package: it imports nothing of it, so every layer may use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
"""What a secret is replaced with."""

SECRET_FLAGS = ("--api-key",)
"""Flags whose value is a secret (spelled with '-'; '_' in their names is matched as well)."""

_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*:)[^\s/?#'\"]*@")
"""A URL's ``scheme://user:`` and its password up to the last ``@`` of the authority (a password may hold a
raw ``@``; urllib splits at the last one too)."""


def redact_url(url: str) -> str:
    """``url`` with its password replaced (``ws://user:***@host:port``); a URL without one is returned as it is."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # e.g. a port that is no number: still a URL whose password must not show
        return redact_text(url)
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def redact_text(text: str) -> str:
    """``text`` (a message, an error, a log line) with the password of every URL in it replaced."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)


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


def _is_secret_flag(arg: str) -> bool:
    return arg.startswith("--") and "--" + arg[2:].replace("_", "-") in SECRET_FLAGS


__all__ = ["REDACTED", "SECRET_FLAGS", "redact_argv", "redact_text", "redact_url"]
