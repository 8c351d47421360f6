"""The page's formatting rules: n/a for anything missing or non-finite, links relative and quoted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from plugrl_env_client.outputs.run_dir import finite_json
from plugrl_env_client.report.html import _href, fmt, server_url


@pytest.mark.parametrize("value,spec,text", [(None, ".3f", "n/a"), (math.nan, ".3f", "n/a"), (math.inf, ",.0f", "n/a"),
                                             (-math.inf, ".4f", "n/a"), (0.1234567, ".3f", "0.123"),
                                             (12345.6, ",.0f", "12,346"), (7, ".4g", "7")])
def test_fmt(value, spec, text):
    assert fmt(value, spec) == text


def test_links_are_relative_to_the_run_and_quoted():
    root = Path("/runs/exp")
    assert _href(root / "report" / "a.png", root) == "report/a.png"
    assert _href(root / "rollout/proc_000/videos/ep 1#b.mp4", root) == "rollout/proc_000/videos/ep%201%23b.mp4"


def test_non_finite_config_values_become_null():
    assert finite_json({"a": [1.0, math.nan], "b": {"c": math.inf}, "d": "nan"}) == \
        {"a": [1.0, None], "b": {"c": None}, "d": "nan"}


def test_the_server_shown_is_the_url_the_run_used():
    assert server_url({"server_url": "ws://10.0.0.2:9000", "server_host": "127.0.0.1", "server_port": 8000}) == \
        "ws://10.0.0.2:9000"
    assert server_url({"server_url": None, "server_host": "gpu-box", "server_port": 8100}) == "ws://gpu-box:8100"
    older = {"server_url": None, "server_host": "127.0.0.1", "server_port": 8000, "local_policy": "random"}
    assert server_url(older) == "the embedded server (its port was not recorded)", "not the flags' default port"
    assert server_url({}) is None
