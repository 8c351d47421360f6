"""The map between an env's observation and openpi's request keys, in memory: presets, overrides, nesting and
channel-first layout, resizing with padding (against Pillow's own operations), a missing key named with the env's
keys, and the map read backwards as the reference server reads requests."""

from __future__ import annotations

import numpy as np
import pytest
from extras import need

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol.openpi_keys import KeyMap, MissingKey, resize_with_pad

Image = need("PIL.Image")


class Obs:
    def __init__(self, images=None, states=None, text=("pick it up", "")):
        self.images, self.states, self.text = images or {}, states or {}, np.array(text)


def batch(h: int = 30, w: int = 50) -> Obs:
    rng = np.random.default_rng(0)
    return Obs(images={"agentview": rng.integers(0, 256, (2, h, w, 3), np.uint8),
                       "wrist": rng.integers(0, 256, (2, h, w, 3), np.uint8)},
               states={"state": np.arange(16, dtype=np.float32).reshape(2, 8)})


def pillow_pad(image: np.ndarray, size: int) -> np.ndarray:
    """Pillow's bilinear fit of ``image`` into ``size`` x ``size``, pasted centred on zeros, step by step."""
    h, w = image.shape[:2]
    ratio = max(w / size, h / size)
    fitted = Image.fromarray(image).resize((int(w / ratio), int(h / ratio)), resample=Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (size, size), 0)
    canvas.paste(fitted, ((size - fitted.width) // 2, (size - fitted.height) // 2))
    return np.asarray(canvas)


@pytest.mark.parametrize("shape", [(30, 50, 3), (50, 30, 3), (224, 224, 3), (256, 256, 3), (7, 300, 3)])
def test_images_are_resized_with_padding_as_pillow_does_it(shape):
    image = np.random.default_rng(1).integers(0, 256, shape, np.uint8)
    out = resize_with_pad(image, 224, 224)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert np.array_equal(out, pillow_pad(image, 224))
    if shape[0] < shape[1]:
        assert not out[0].any() and not out[-1].any(), "padded with zeros above and below"


def test_the_libero_preset_sends_one_envs_row_under_openpis_keys():
    obs = batch()
    request = KeyMap.of("libero").request(obs, 1)
    assert sorted(request) == ["observation/image", "observation/state", "observation/wrist_image"], \
        "env 1's empty text leaves the prompt out"
    assert np.array_equal(request["observation/image"], pillow_pad(obs.images["agentview"][1], 224))
    assert np.array_equal(request["observation/state"], obs.states["state"][1])
    assert KeyMap.of("libero").request(obs, 0)["prompt"] == "pick it up"


def test_overrides_replace_add_and_drop_keys_and_nest_with_dots():
    obs = batch(224, 224)
    keys = KeyMap.of("libero", ["observation/image=images.wrist", "observation/wrist_image=",
                                "extra.nested.state=states.state"], image_size=0)
    request = keys.request(obs, 0)
    assert np.array_equal(request["observation/image"], obs.images["wrist"][0])
    assert "observation/wrist_image" not in request
    assert np.array_equal(request["extra"]["nested"]["state"], obs.states["state"][0])


def test_the_aloha_preset_nests_its_cameras_channel_first():
    obs = Obs(images={"pixels.top": np.zeros((1, 48, 64, 3), np.uint8)}, states={"agent_pos": np.zeros((1, 14))},
              text=("",))
    request = KeyMap.of("aloha").request(obs, 0)
    assert request["images"]["cam_high"].shape == (3, 224, 224) and request["state"].shape == (14,)
    back = KeyMap.of("aloha").observation(request)
    assert back["images"]["pixels.top"].shape == (1, 224, 224, 3), "read back channel-last, as a batch of one"


def test_without_a_preset_the_observation_goes_as_it_is_and_comes_back():
    obs = batch(224, 224)
    keys = KeyMap.of("none")
    request = keys.request(obs, 0)
    assert sorted(request) == ["images", "prompt", "states"] and sorted(request["images"]) == ["agentview", "wrist"]
    back = keys.observation(request)
    assert np.array_equal(back["images"]["wrist"][0], obs.images["wrist"][0])
    assert np.array_equal(back["states"]["state"][0], obs.states["state"][0]) and back["text"].tolist() == ["pick it up"]


def test_a_key_the_env_lacks_names_the_envs_keys():
    with pytest.raises(MissingKey) as caught:
        KeyMap.of("droid").check(batch())
    assert str(caught.value) == ("openpi key 'observation/exterior_image_1_left' is taken from "
                                 "images['exterior_image_1_left'], which the env's observation does not have (it has "
                                 "images: agentview, wrist; states: state)")


@pytest.mark.parametrize("preset, overrides, message", [
    ("pi0", [], "unknown preset 'pi0'"),
    ("none", ["observation/image"], "is not openpi_key=observation_path"),
    ("none", ["a=camera.front"], "'camera.front' is not an observation path"),
    ("none", ["a=text.x"], "'text.x' is not an observation path"),
])
def test_bad_maps_say_what_is_wrong(preset, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        KeyMap.of(preset, overrides)


def test_a_request_without_a_mapped_key_is_refused_by_name():
    with pytest.raises(ProtocolError, match=r"the request has no 'observation/image'.*its keys: \['prompt'\]"):
        KeyMap.of("libero").observation({"prompt": "x"})
