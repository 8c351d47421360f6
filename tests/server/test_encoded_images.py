"""Camera images encoded per env row (the x-plugrl-env-client-images feature) at the reference server, driven by a
raw client over real sockets: offered in the metadata, decoded before the policy sees them, and a resync naming the
field for an encoded image whose size is not the declared one."""

from __future__ import annotations

import numpy as np
import pytest
from extras import need
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, images, messages
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

need("simplejpeg")
need("qoi")


@pytest.fixture
def server_factory():
    made = []

    def start(**kwargs):
        server = PolicyServer(make_policy(PolicyConfig()), host="127.0.0.1", port=0, **kwargs).start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.shutdown()


def open_client(server):
    ws = connect(server.url, compression=None, max_size=None, proxy=None).__enter__()
    return ws, messages.parse_metadata(codec.unpackb(ws.recv(timeout=5)))


def close_of(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=5)
    return info.value.rcvd.code, info.value.rcvd.reason


def violation_of(caplog, port: int) -> str:
    """The protocol violation the server logged for the client connection from local ``port``."""
    found = [r.getMessage() for r in caplog.records
             if "protocol violation" in r.getMessage() and f", {port})" in r.getMessage()]
    assert len(found) == 1, f"expected one violation logged for port {port}, got {found}"
    return found[0]


class Batch:
    """An observation batch with a 3-channel, a 1-channel and a 4-channel camera whose pixels name the env."""

    def __init__(self, ids, base: int = 0) -> None:
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        y, x = np.mgrid[0:24, 0:32]
        ramp = (y + x + base)[None, :, :, None] + 10 * ids[:, None, None, None]
        self.images = {"front": (ramp + np.array([0, 20, 40])).astype(np.uint8),
                       "depth": ramp.astype(np.uint8),
                       "rgba": (np.arange(n * 8 * 8 * 4).reshape(n, 8, 8, 4) * 7 + base).astype(np.uint8)}
        self.states = {"x": np.stack([ids, np.full(n, base)], axis=1).astype(np.float64)}
        self.text = np.array([f"env {i}" for i in ids.tolist()])


def recording(server) -> list[dict]:
    """The observation batches the server's policy is asked to act on, from now on."""
    seen: list[dict] = []
    act = server.policy.act

    def record(obs, n):
        seen.append(obs)
        return act(obs, n)

    server.policy.act = record
    return seen


def infer_frame(batch: Batch, ids, codec_name: str, reuse=None) -> bytes:
    ids = np.asarray(ids, np.int64)
    return codec.packb(messages.InferRequest(messages.wire_observation(batch, codec_name), ids,
                                             np.zeros(len(ids), np.int64), reuse).message())


def test_the_server_offers_the_feature_and_can_be_started_without_it(server_factory):
    _, meta = open_client(server_factory())
    assert meta.features == (messages.FEATURE_REUSE_FEEDBACK_OBS, images.FEATURE)
    _, meta = open_client(server_factory(image_codecs=False, reuse_feedback_obs=False))
    assert meta.features == ()


@pytest.mark.parametrize("codec_name", ["jpeg", "qoi"])
def test_encoded_cameras_reach_the_policy_as_arrays_of_the_declared_shape(server_factory, codec_name):
    server = server_factory()
    seen = recording(server)
    ws, _ = open_client(server)
    batch = Batch([0, 1, 2])
    wire = messages.wire_observation(batch, codec_name)
    carried = {name for name, value in wire["images"].items() if isinstance(value, dict)}
    assert carried == ({"front", "depth"} if codec_name == "jpeg" else {"front", "rgba"})
    ws.send(infer_frame(batch, [0, 1, 2], codec_name))
    messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([0, 1, 2]))
    ws.close()
    obs = seen[-1]["images"]
    for name, sent in batch.images.items():
        assert obs[name].shape == sent.shape and obs[name].dtype == np.uint8
        if codec_name == "jpeg" and name in carried:  # lossy: within JPEG's error on smooth ramps
            error = np.abs(obs[name].astype(int) - sent)
            assert error.mean() < 3 and error.max() <= 16
        else:
            np.testing.assert_array_equal(obs[name], sent)  # qoi is exact, and raw cameras are the arrays


def test_a_terminal_observation_in_a_feedback_is_decoded_and_reused_rows_follow_it(server_factory):
    """The feedback's encoded rows are decoded before they are held, so an infer that reuses some rows and sends
    others encoded gets the decoded rows of both, in env order."""
    server = server_factory()
    seen = recording(server)
    ws, _ = open_client(server)
    ids = np.array([0, 1, 2])
    ws.send(infer_frame(Batch(ids), ids, "qoi"))
    ws.recv(timeout=5)
    final = Batch(ids, base=5)
    ws.send(codec.packb(messages.Feedback(ids, np.zeros(3, np.int64), messages.wire_observation(final, "qoi"),
                                          np.ones(3, np.float32), np.array([False, True, False]),
                                          np.zeros(3, bool), {}).message()))
    fresh = Batch([1], base=9)
    ws.send(infer_frame(fresh, ids, "qoi", reuse=np.array([True, False, True])))
    ws.recv(timeout=5)
    ws.close()
    obs = seen[-1]
    np.testing.assert_array_equal(obs["images"]["front"], np.stack([final.images["front"][0], fresh.images["front"][0],
                                                                    final.images["front"][2]]))
    np.testing.assert_array_equal(obs["states"]["x"][:, 1], [5, 9, 5])


def crafted(rows_from, declared, codec_name="jpeg") -> dict:
    """An infer whose camera 'front' declares ``declared`` but carries the rows of ``rows_from``."""
    sent = messages.wire_observation(Batch([0]), "none")
    sent["images"] = {"front": {"codec": codec_name, "shape": list(declared),
                                "rows": images.encode(rows_from, codec_name)}}
    return messages.InferRequest(sent, np.array([0]), np.array([0])).message()


@pytest.mark.parametrize("codec_name", ["jpeg", "qoi"])
def test_an_encoded_row_of_another_size_than_declared_is_a_resync_naming_the_field(server_factory, caplog,
                                                                                   codec_name):
    server = server_factory()
    seen = recording(server)
    ws, _ = open_client(server)
    port = ws.local_address[1]
    ws.send(codec.packb(crafted(np.zeros((1, 48, 64, 3), np.uint8), (1, 24, 32, 3), codec_name)))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    said = violation_of(caplog, port)
    assert ("infer data['images']['front'] row 0: the encoded image is 48x64x3, the declared shape says 24x32x3"
            in said)
    assert not seen, "the policy never saw the batch"


@pytest.mark.parametrize("mangle,words", [
    (lambda m: m.update(codec="png"), "infer data['images']['front']['codec'] must be one of jpeg, qoi, got 'png'"),
    (lambda m: m.update(shape=[1, 24, 32]), "infer data['images']['front']['shape'] must be 4 ints"),
    (lambda m: m.update(rows=b"x"), "infer data['images']['front']['rows'] must be a list of bytes"),
    (lambda m: m.pop("rows"), "must be an array or a map with exactly the keys codec, shape, rows"),
    (lambda m: m.update(rows=[b"not a jpeg"]), "infer data['images']['front'] row 0: not a JPEG image"),
])
def test_a_malformed_encoded_map_is_a_resync_naming_the_field(server_factory, caplog, mangle, words):
    server = server_factory()
    ws, _ = open_client(server)
    port = ws.local_address[1]
    msg = crafted(np.zeros((1, 24, 32, 3), np.uint8), (1, 24, 32, 3))
    mangle(msg["data"]["images"]["front"])
    ws.send(codec.packb(msg))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert words in violation_of(caplog, port)


def test_a_server_without_the_feature_refuses_an_encoded_map_saying_so(server_factory, caplog):
    server = server_factory(image_codecs=False)
    ws, _ = open_client(server)
    port = ws.local_address[1]
    ws.send(codec.packb(crafted(np.zeros((1, 24, 32, 3), np.uint8), (1, 24, 32, 3))))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert (f"infer data['images']['front'] is an encoded image map, but this server did not offer {images.FEATURE}"
            in violation_of(caplog, port))


def test_the_parser_decodes_only_when_asked():
    msg = codec.unpackb(infer_frame(Batch([0, 1]), [0, 1], "jpeg"))
    with pytest.raises(ProtocolError, match="is an encoded image map"):
        messages.parse_infer(codec.unpackb(infer_frame(Batch([0, 1]), [0, 1], "jpeg")))
    request = messages.parse_infer(msg, decode_images=True)
    assert request.obs["images"]["front"].shape == (2, 24, 32, 3)


def jpeg_claiming(height: int, width: int) -> bytes:
    """A small JPEG whose header (its SOF0 segment) is patched to claim ``height`` x ``width``."""
    data = bytearray(images.encode(np.zeros((1, 8, 8, 3), np.uint8), "jpeg")[0])
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def test_a_small_frame_declaring_a_huge_image_is_refused_unread(server_factory, caplog):
    """A frame of about a kilobyte whose header and declared shape agree on 6000x6000 (108 MB decoded) is over the
    default bound: the connection is resynced with a log line saying why, and nothing of that size is allocated."""
    import tracemalloc

    server = server_factory()
    seen = recording(server)
    ws, _ = open_client(server)
    port = ws.local_address[1]
    msg = crafted(np.zeros((1, 8, 8, 3), np.uint8), (1, 6000, 6000, 3))
    msg["data"]["images"]["front"]["rows"] = [jpeg_claiming(6000, 6000)]
    frame = codec.packb(msg)
    assert len(frame) < 2000
    tracemalloc.start()
    try:
        ws.send(frame)
        assert close_of(ws) == (1001, messages.REASON_RESYNC)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000
    said = violation_of(caplog, port)
    assert (f"infer data['images']['front']: the declared shape [1, 6000, 6000, 3] is 36000000 pixels of encoded "
            f"images, over the {images.DEFAULT_MAX_PIXELS} pixels one message may declare here (a server started "
            "with a larger --max-image-pixels takes it)") in said
    assert not seen
    again, _ = open_client(server)  # the server goes on serving
    again.close()


def test_the_bound_counts_every_camera_of_a_message(server_factory, caplog):
    """24x32 pixels a camera, 3 env rows: 2304 each; with a bound of 3000 the first camera fits, the second (its
    pixels added) does not; raw cameras are not counted."""
    server = server_factory(max_image_pixels=3000)
    ws, _ = open_client(server)
    port = ws.local_address[1]
    ws.send(infer_frame(Batch([0, 1, 2]), [0, 1, 2], "jpeg"))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert ("infer data['images']['depth']: the declared shape [3, 24, 32, 1] is 2304 pixels of encoded images "
            "(4608 with the message's cameras before it), over the 3000 pixels") in violation_of(caplog, port)
    roomy = server_factory(max_image_pixels=2 * 2304)
    ws, _ = open_client(roomy)
    ws.send(infer_frame(Batch([0, 1, 2]), [0, 1, 2], "jpeg"))
    messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([0, 1, 2]))
    ws.close()
