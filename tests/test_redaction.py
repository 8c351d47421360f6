"""The one rule for secrets: URL passwords and ``--api-key`` values never show, everything else stays as it was."""

from __future__ import annotations

import pytest

from plugrl_env_client.redaction import REDACTED, redact_argv, redact_text, redact_url


@pytest.mark.parametrize("url, shown", [
    ("ws://user:secret@127.0.0.1:8000", "ws://user:***@127.0.0.1:8000"),
    ("wss://user:secret@host.example/path?q=1", "wss://user:***@host.example/path?q=1"),
    ("ws://:secret@host:1", "ws://:***@host:1"),
    ("ws://user:p@ss@host:1", "ws://user:***@host:1"),  # a raw '@' in the password: split at the last one
    ("ws://user:secret@[::1]:8000", "ws://user:***@[::1]:8000"),
    ("ws://user@host:1", "ws://user@host:1"),  # no password: nothing to hide
    ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000"),
    ("ws://user:secret@host:notaport", "ws://user:***@host:notaport"),  # unparsable, still hidden
])
def test_redact_url_hides_the_password_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown


def test_redact_text_hides_every_url_password_in_a_message():
    text = ("waiting for a policy server at ws://user:secret@127.0.0.1:9 (refused); "
            "invalid server URL 'ws://a:b@c:x': ws://a:b@c:x isn't a valid URI")
    shown = redact_text(text)
    assert "secret" not in shown and ":b@" not in shown
    assert shown.startswith("waiting for a policy server at ws://user:***@127.0.0.1:9 (refused)")
    assert "'ws://a:***@c:x'" in shown
    assert redact_text("no URL here: host:8000, a@b, x:y@z") == "no URL here: host:8000, a@b, x:y@z"


def test_redact_argv_hides_api_key_values_in_both_spellings_and_url_passwords():
    argv = ["plugrl-run-env-client", "point-v1", "--api-key", "K1", "--api-key=K2", "--api_key", "K3",
            "--server-url", "ws://u:pw@h:1", "--server-url=ws://u:pw2@h:1", "--num-envs", "2"]
    shown = redact_argv(argv)
    assert shown == ["plugrl-run-env-client", "point-v1", "--api-key", REDACTED, f"--api-key={REDACTED}",
                     "--api_key", REDACTED, "--server-url", "ws://u:***@h:1", "--server-url=ws://u:***@h:1",
                     "--num-envs", "2"]
    assert argv[3] == "K1", "the caller's list is left as it was"


def test_redact_argv_leaves_other_flags_and_a_trailing_flag_alone():
    assert redact_argv(["x", "--api-keys", "v", "--num-envs", "4"]) == ["x", "--api-keys", "v", "--num-envs", "4"]
    assert redact_argv(["x", "--api-key"]) == ["x", "--api-key"]
