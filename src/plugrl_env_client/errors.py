"""User-facing error types.

Every error a user can cause (a misconfigured env, a server speaking another dialect, a bad flag) is one of these.
The CLI prints their message and exits non-zero; the traceback goes to the run's log file. Anything else that
escapes is a bug in this package and is shown with its traceback.
"""

from __future__ import annotations


class PlugRLError(Exception):
    """Base class of errors whose message tells the user what went wrong and what to do."""


class EnvContractError(PlugRLError):
    """An env returned something outside the batched env contract (shapes, dtypes, missing spaces)."""


class ConfigError(PlugRLError):
    """A registration or command-line setting cannot work as given."""


class EnvCrashedError(PlugRLError):
    """An env's own ``reset``/``step`` raised; the run stops with the env id, the call and the exception."""


class EnvExitError(EnvCrashedError):
    """Env code tried to end the process (``SystemExit``, its own ``KeyboardInterrupt``, another
    ``BaseException``): a failure of the env even where an ordinary exception would only be logged (``close``)."""


class OutputError(PlugRLError):
    """The run folder cannot be written: a file where a folder should be, a read-only or a full disk."""


class ProtocolError(PlugRLError):
    """Bytes or messages that do not follow the PlugRL wire protocol v1 (see SPEC.md)."""
