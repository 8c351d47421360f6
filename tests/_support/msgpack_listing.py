"""Annotated msgpack token listings of one small example of each message: what SPEC.md §4.6 shows.

``python tests/_support/msgpack_listing.py`` prints the section's listings; the test re-derives them.
"""
import numpy as np

from plugrl_env_client.protocol import codec, messages


def walk(b, i, depth, out):
    t = b[i]
    pad = "  " * depth

    def emit(n, text):
        out.append((pad + " ".join(f"{x:02x}" for x in b[i:i + n]), pad + text))
        return i + n

    if t <= 0x7f:
        return emit(1, f"int {t}")
    if 0x80 <= t <= 0x8f:
        n = t & 0x0f
        start = len(out)
        j = emit(1, f"map, {n} entries")
        for _ in range(2 * n):
            j = walk(b, j, depth + 1, out)
        if b[i + 1:i + 14] == b"\xc4\x0b__ndarray__":
            arr = codec.unpackb(b[i:j])
            out[start] = (out[start][0], out[start][1] + " (an ndarray)")
            k = next(k for k in range(start, len(out)) if "raw array bytes" in out[k][1])
            out[k] = (out[k][0], out[k][1].replace("raw array bytes", f"data = {arr.tolist()}"))
        return j
    if 0x90 <= t <= 0x9f:
        n = t & 0x0f
        j = emit(1, f"array({n})")
        for _ in range(n):
            j = walk(b, j, depth + 1, out)
        return j
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return emit(1 + n, f"str({n}) {b[i+1:i+1+n].decode()!r}")
    if t == 0xc3:
        return emit(1, "true")
    if t == 0xc2:
        return emit(1, "false")
    if t == 0xc4:
        n = b[i + 1]
        raw = b[i + 2:i + 2 + n]
        text = f"bin({n}) b{raw.decode()!r}" if raw.isascii() and raw.decode().isprintable() and n < 16 else f"bin({n}) raw array bytes"
        if raw[:4] == b"qoif":  # an encoded camera row: what its QOI header says
            width, height, channels = int.from_bytes(raw[4:8], "big"), int.from_bytes(raw[8:12], "big"), raw[12]
            text = f"bin({n}) a QOI image: 'qoif', {width}x{height}, {channels} channels, its pixels, end marker"
        return emit(2 + n, text)
    if t == 0xd9:
        n = b[i + 1]
        return emit(2 + n, f"str8({n}) {b[i+2:i+2+n].decode()!r}")
    raise ValueError(hex(t))


def listing(msg) -> list[str]:
    """One line per msgpack token: hex bytes, then what they mean."""
    b = codec.packb(msg)
    out = []
    assert walk(b, 0, 0, out) == len(b)
    width = max(len(h) for h, _ in out) + 2
    # bytes outside an ndarray map (an encoded image's row) are not array data
    return [h.ljust(width) + t.lstrip().replace("raw array bytes", "raw bytes") for h, t in out]


def examples() -> dict:
    obs1 = {"images": {}, "states": {"t": np.array([[2.0]], "<f4")}, "text": np.array(["go"])}
    return {
        "metadata": messages.metadata_message({"protocol_version": 1, "action_horizon": 2}),
        "infer": messages.InferRequest(obs1, np.array([3]), np.array([0])).message(),
        "action": messages.ActionReply(np.array([3]), np.array([[[0.5]], [[-0.5]]], "<f4")).message(),
        "feedback": messages.Feedback(np.array([3]), np.array([0]), obs1, np.array([2.0], "<f4"),
                                      np.array([False]), np.array([False]), {}).message(),
    }


def encoded_example() -> dict:
    """SPEC's example of the images feature: env 3's one-pixel camera (10, 20, 30), QOI-encoded (an exact codec,
    and the shortest image file there is)."""
    cam = Observation({"cam": np.array([[[[10, 20, 30]]]], np.uint8)}, {}, np.array(["go"]))
    return messages.InferRequest(messages.wire_observation(cam, "qoi"), np.array([3]), np.array([0])).message()


class Observation:
    def __init__(self, images: dict, states: dict, text: np.ndarray) -> None:
        self.images, self.states, self.text = images, states, text


if __name__ == "__main__":
    for name, msg in examples().items():
        print(f"#### `{name}` ({len(codec.packb(msg))} bytes)\n\n```")
        print("\n".join(listing(msg)))
        print("```\n")
    msg = encoded_example()
    print(f"#### `infer` with an encoded camera ({len(codec.packb(msg))} bytes)\n\n```")
    print("\n".join(listing(msg)))
    print("```")
