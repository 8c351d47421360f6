"""SPEC.md §4.6 shows each message byte by byte; these must be exactly what the codec produces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from extras import need
from msgpack_listing import encoded_example, examples, listing

from plugrl_env_client.protocol import codec

SPEC = (Path(__file__).resolve().parents[2] / "SPEC.md").read_text()


def _check_listing(msg: object, heading: str) -> None:
    """SPEC's byte listing under ``heading`` is ``msg``'s bytes, line by line, and its byte count."""
    block = re.search(rf"#### {re.escape(heading)} \((\d+) bytes\)\n\n```\n(.*?)```", SPEC, re.S)
    assert block, f"SPEC.md has no byte listing under '#### {heading}'"
    assert int(block.group(1)) == len(codec.packb(msg))
    assert block.group(2).rstrip("\n").splitlines() == listing(msg)
    hex_bytes = []
    for line in block.group(2).splitlines():
        words = line.split()
        hex_bytes += words[: next(i for i, w in enumerate(words) if not re.fullmatch(r"[0-9a-f]{2}", w))]
    assert bytes.fromhex("".join(hex_bytes)) == codec.packb(msg), "the listing's bytes are the whole message"


@pytest.mark.parametrize("name", ["metadata", "infer", "action", "feedback"])
def test_spec_listing_matches_the_codec(name):
    _check_listing(examples()[name], f"`{name}`")


def test_spec_listing_of_an_encoded_camera_matches_the_codec():
    """§5a's infer with a QOI-encoded camera, byte by byte."""
    need("qoi")
    _check_listing(encoded_example(), "`infer` with an encoded camera")
