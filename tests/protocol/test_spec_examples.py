"""SPEC.md §4.6 shows each message byte by byte; these must be exactly what the codec produces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from msgpack_listing import encoded_example, examples, listing

from plugrl_env_client.protocol import codec

SPEC = (Path(__file__).resolve().parents[2] / "SPEC.md").read_text()


@pytest.mark.parametrize("name", ["metadata", "infer", "action", "feedback"])
def test_spec_listing_matches_the_codec(name):
    msg = examples()[name]
    block = re.search(rf"#### `{name}` \((\d+) bytes\)\n\n```\n(.*?)```", SPEC, re.S)
    assert block, f"SPEC.md has no byte listing for {name}"
    assert int(block.group(1)) == len(codec.packb(msg))
    assert block.group(2).rstrip("\n").splitlines() == listing(msg)
    hex_bytes = []
    for line in block.group(2).splitlines():
        words = line.split()
        hex_bytes += words[: next(i for i, w in enumerate(words) if not re.fullmatch(r"[0-9a-f]{2}", w))]
    assert bytes.fromhex("".join(hex_bytes)) == codec.packb(msg), "the listing's bytes are the whole message"


def test_spec_listing_of_an_encoded_camera_matches_the_codec():
    """§5a's infer with a QOI-encoded camera, byte by byte."""
    pytest.importorskip("qoi", reason="the images extra (qoi) is not installed")
    msg = encoded_example()
    block = re.search(r"#### `infer` with an encoded camera \((\d+) bytes\)\n\n```\n(.*?)```", SPEC, re.S)
    assert block, "SPEC.md has no byte listing of an encoded camera"
    assert int(block.group(1)) == len(codec.packb(msg))
    assert block.group(2).rstrip("\n").splitlines() == listing(msg)
    hex_bytes = []
    for line in block.group(2).splitlines():
        words = line.split()
        hex_bytes += words[: next(i for i, w in enumerate(words) if not re.fullmatch(r"[0-9a-f]{2}", w))]
    assert bytes.fromhex("".join(hex_bytes)) == codec.packb(msg), "the listing's bytes are the whole message"
