"""GEM-v1 with real GEM games (offline): batching, per-env RNG isolation, concurrency, observations, info, close.

Besides GEM's own games, a few small GEM-style envs are registered with GEM here to reach what the games never
do (images, a dataset that runs out, tool counters, failing closes).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.errors import ConfigError, EnvContractError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="needs the gem extra")

if importlib.util.find_spec("gem") is not None:
    from plugrl_env_client.envs.gem import gem_env
    from plugrl_env_client.envs.gem.gem_env import GemEnv, GemEnvConfig, import_gem, parse_env_kwargs

GUESS = "game:GuessTheNumber-v0-easy"  # 1..10, 4 turns
MASTERMIND = "game:Mastermind-v0-easy"
AGG_MODES = {"sum", "mean", "min", "max", "last", "first"}


# ---------------------------------------------------------------------------------------------------- test envs

class Recorder:
    """What the scripted envs did, shared by all their instances (reset between tests)."""

    ids = itertools.count()
    closed: list[int] = []
    stepped: list[int] = []
    close_raises: dict[int, type[BaseException]] = {}
    step_raises: set[int] = set()
    make_raises_at: int | None = None
    barrier: threading.Barrier | None = None
    lock_free_during_step: list[bool] = []


class ScriptedEnv:
    """A GEM-style env (``reset(seed)`` / ``step(str)``): echoes actions, reports a tool counter, closes on record."""

    def __init__(self, episodes: int | None = None, **_: Any) -> None:
        self.uid = next(Recorder.ids)
        if Recorder.make_raises_at is not None and self.uid == Recorder.make_raises_at:
            raise RuntimeError("cannot start")
        self.episodes_left = episodes
        self.t = 0

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        if self.episodes_left is not None:
            if self.episodes_left == 0:
                return None, {}
            self.episodes_left -= 1
        self.t = 0
        return f"start {self.uid}", {"prefix": f"rules of {self.uid}", "suffix": "Go."}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]:
        Recorder.stepped.append(self.uid)
        if self.uid in Recorder.step_raises:
            raise RuntimeError("tool crashed")
        if Recorder.barrier is not None:
            Recorder.barrier.wait()  # passes only when all parties step at the same time
        self.t += 1
        info = {"tool_use_counter": self.t * 10 + self.uid % 10, "note": "text", "nan": float("nan"), "flag": True}
        if self.t == 2:
            info["correct"] = action == "win"
        return f"{self.uid}:{action}", float(self.t == 2 and action == "win"), self.t == 2, False, info

    def close(self) -> None:
        Recorder.closed.append(self.uid)
        exc = Recorder.close_raises.get(self.uid)
        if exc is not None:
            raise exc("close failed")


class LockProbeEnv(ScriptedEnv):
    """Records whether another thread could take the env lock while this env steps."""

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]:
        result: list[bool] = []

        def probe() -> None:
            took = gem_env._ENV_LOCK.acquire(blocking=False)
            if took:
                gem_env._ENV_LOCK.release()
            result.append(took)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        Recorder.lock_free_during_step.append(result[0])
        return super().step(action)


class ImageEnv:
    """Observations as GEM's visual envs give them: arrays, dicts with a prompt and frame lists, or text."""

    def __init__(self, kind: str = "array", size: int = 4, **_: Any) -> None:
        self.kind, self.size, self.t = kind, size, 0

    def frame(self, value: int) -> np.ndarray:
        return np.full((self.size, self.size, 3), value, dtype=np.uint8)

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        self.t = 0
        if self.kind == "array":
            return self.frame(7), {}
        if self.kind == "gray-float":
            return np.full((self.size, self.size), 0.5), {}
        return {"prompt": "what is shown?", "image": [self.frame(9), self.frame(1)]}, {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        if self.kind == "dict":
            return "text only now", 0.0, False, False, {}
        return {"prompt": "video", "video": [[self.frame(3), self.frame(4)]]}, 0.0, False, False, {}


class StrictEnv:
    """A constructor that takes no unknown keyword arguments."""

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        return "x", {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]:
        return "x", 0.0, True, False, {}


TEST_ENVS = {"test:Scripted-v0": ScriptedEnv, "test:LockProbe-v0": LockProbeEnv, "test:Image-v0": ImageEnv,
             "test:Strict-v0": StrictEnv}


@pytest.fixture(autouse=True)
def _gem_registry():
    registry = import_gem().envs.registration.ENV_REGISTRY
    for env_id, cls in TEST_ENVS.items():
        if env_id not in registry:
            import_gem().register(env_id, cls)
    Recorder.closed, Recorder.stepped, Recorder.lock_free_during_step = [], [], []
    Recorder.close_raises, Recorder.step_raises, Recorder.make_raises_at, Recorder.barrier = {}, set(), None, None
    Recorder.ids = itertools.count()
    yield


def make(n: int, env_id: str = GUESS, **config: Any) -> GemEnv:
    return GemEnv(GemEnvConfig(env_id=env_id, **config), num_envs=n)


# ---------------------------------------------------------------------------------------------------- driving

def boxed(value: object) -> str:
    """An answer in GEM's format."""
    return "\\boxed{" + str(value) + "}"


def guess_policy(text: str, turn: int) -> str:
    """Deterministic, RNG-free answers that depend on the feedback (so a different target shows)."""
    if turn % 4 == 3:
        return "no box here"  # a format error now and then
    m = re.search(r"you guessed (\d+), and the target number is (higher|lower)", text)
    if m is None:
        return "\\boxed{5}"
    g = int(m.group(1))
    return boxed(min(10, g + 2) if m.group(2) == "higher" else max(1, g - 2))


def mastermind_policy(text: str, turn: int) -> str:
    return boxed(f"{1 + turn % 6} {1 + (turn + 2) % 6}")


def drive(env: GemEnv, seed: int | None, steps: int, policy=guess_policy, between=None) -> list[list[tuple]]:
    """Run ``steps`` batched steps, resetting finished envs (no seed); per env the transcript of
    (text, reward, terminated, truncated) including every reset observation."""
    obs, _ = env.reset(seed=seed)
    n = env.num_envs
    log: list[list[tuple]] = [[("reset", t)] for t in obs.text.tolist()]
    turns = [0] * n
    for _ in range(steps):
        actions = np.array([policy(obs.text[i], turns[i]) for i in range(n)])
        obs, reward, terminated, truncated, _ = env.step(actions)
        for i in range(n):
            turns[i] += 1
            log[i].append((obs.text[i], float(reward[i]), bool(terminated[i]), bool(truncated[i])))
        done = terminated | truncated
        if between is not None:
            between()
        if done.any():
            obs, _ = env.reset(options={"reset_mask": done, "reset_indices": np.flatnonzero(done)})
            for i in np.flatnonzero(done).tolist():
                log[i].append(("reset", obs.text[i]))
    return log


def targets(env: GemEnv) -> list[int]:
    return [e.game_number for e in env.sub_envs]


# ---------------------------------------------------------------------------------------------------- RNG isolation

@pytest.mark.slow
@pytest.mark.parametrize("env_id, policy", [(GUESS, guess_policy), (MASTERMIND, mastermind_policy)])
def test_env_i_of_a_batch_plays_as_if_alone(env_id, policy):
    batch = make(4, env_id)
    together = drive(batch, seed=100, steps=14, policy=policy)
    batch.close()
    for i in range(4):
        alone = make(1, env_id)
        assert drive(alone, seed=100 + i, steps=14, policy=policy)[0] == together[i], f"env {i}"
        alone.close()


def test_same_seed_same_episodes_and_envs_differ():
    a, b = make(8), make(8)
    a.reset(seed=7)
    b.reset(seed=7)
    assert targets(a) == targets(b)
    assert len(set(targets(a))) > 1
    assert drive(make(3), seed=1, steps=12) == drive(make(3), seed=1, steps=12)
    assert drive(make(3), seed=1, steps=12) != drive(make(3), seed=2, steps=12)


@pytest.mark.slow
def test_same_seed_same_episodes_across_processes():
    code = ("import numpy as np; from plugrl_env_client.envs.gem.gem_env import GemEnv, GemEnvConfig\n"
            "env = GemEnv(GemEnvConfig(env_id='game:GuessTheNumber-v0-random'), num_envs=3)\n"
            "obs, _ = env.reset(seed=5); print([e.game_number for e in env.sub_envs], obs.text.tolist())\n"
            "env.reset(); print([e.game_number for e in env.sub_envs])")
    runs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(h)}, text=True,
                           capture_output=True, check=True, timeout=300).stdout for h in (1, 2)}
    assert len(runs) == 1 and runs.pop().count("[") >= 3


def test_interleaving_other_envs_and_global_draws_changes_nothing():
    alone = drive(make(2), seed=3, steps=15)
    other = make(3)
    other.reset(seed=99)

    def disturb() -> None:
        other.step(np.array(["\\boxed{4}"] * 3))
        other.reset(options={"reset_indices": [0, 2]})
        random.seed(123)
        random.random()
        np.random.seed(5)
        np.random.rand(3)

    assert drive(make(2), seed=3, steps=15, between=disturb) == alone


def test_resetting_one_env_does_not_change_another():
    def run(extra_resets: int) -> list[tuple]:
        env = make(2)

        def reset_env_1() -> None:
            for _ in range(extra_resets):
                env.reset(options={"reset_indices": [1]})

        return drive(env, seed=8, steps=16, between=reset_env_1)[0]

    assert run(0) == run(3)


def test_process_global_rng_is_left_alone():
    py, npy = random.getstate(), np.random.get_state()
    env = make(3, MASTERMIND)
    env.reset(seed=0)
    env.step(np.array(["\\boxed{1 2}"] * 3))
    env.reset()
    assert random.getstate() == py
    after = np.random.get_state()
    assert all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(after, npy))


def test_without_isolation_gem_seeds_the_process_state():
    env = make(2, rng_isolation="off")
    env.reset(seed=4)
    last = random.Random(5)  # env 1 was seeded with 4 + 1, then drew its target and its instructions' example
    assert targets(env) == [random.Random(4).randint(1, 10), last.randint(1, 10)]
    last.randint(1, 10)
    assert random.getstate() == last.getstate()


# ---------------------------------------------------------------------------------------------------- game flow

def test_kwargs_flags_success_and_metrics():
    env = make(3, env_kwargs=json.dumps({"max_turns": 2}))
    obs, info = env.reset(seed=0)
    assert info["env_instruction"].tolist() == ["", "", ""] and not info["no_episode"].any()
    assert all(t.endswith("\nEnter your next guess.") for t in obs.text.tolist())  # GEM's suffix appended
    t = targets(env)
    wrong = [1 if x != 1 else 2 for x in t]
    obs, reward, terminated, truncated, info = env.step(np.array([boxed(t[0]), boxed(wrong[1]), "???"]))
    assert terminated.tolist() == [True, False, True] and reward.tolist()[0] == 1.0 and reward[2] == np.float32(-0.1)
    assert info["action_is_valid"].tolist() == [True, True, False]
    m = info["metrics"]
    assert m["success"].tolist() == [True, False, False]
    assert m["format_errors"].tolist() == [0, 0, 1] and m["turns"].tolist() == [1, 1, 1]
    assert set(info["metrics_agg_mode"]) == set(m) and set(info["metrics_agg_mode"].values()) <= AGG_MODES
    env.reset(options={"reset_indices": [0, 2]})
    obs, reward, terminated, truncated, info = env.step(np.array([boxed(wrong[0])] * 3))
    assert terminated[1] and truncated[1]  # the second wrong guess of env 1: GEM's timeout, both flags
    assert not info["metrics"]["success"][1]
    assert info["metrics"]["turns"].tolist() == [1, 2, 1]


def test_text_actions_reach_the_sub_env_whole():
    env = make(2, "test:Scripted-v0")
    env.reset(seed=0)
    long = ("Ünïcödé 漢字 🙂 " * 1000)[:10_000]
    obs, *_ = env.step(np.array([long, "short"]))
    assert obs.text.tolist() == [f"0:{long}", "1:short"]
    assert isinstance(env.single_action_space, gym.spaces.Text)


def test_prefix_is_the_instruction_and_numeric_info_becomes_metrics():
    env = make(2, "test:Scripted-v0")
    obs, info = env.reset(seed=0)
    assert info["env_instruction"].tolist() == ["rules of 0", "rules of 1"]
    assert obs.text.tolist() == ["start 0\nGo.", "start 1\nGo."]
    _, _, _, _, info = env.step(np.array(["a", "b"]))
    m, agg = info["metrics"], info["metrics_agg_mode"]
    assert m["tool_use_counter"].tolist() == [10.0, 11.0] and m["flag"].tolist() == [1.0, 1.0]
    assert "note" not in m and "nan" not in m and agg["tool_use_counter"] == "last"
    _, reward, terminated, _, info = env.step(np.array(["win", "lose"]))
    assert terminated.all() and reward.tolist() == [1.0, 0.0]
    assert info["metrics"]["correct"].tolist() == [1.0, 0.0] and info["metrics"]["success"].tolist() == [True, False]
    env.reset(options={"reset_indices": [0, 1]})
    _, _, _, _, info = env.step(np.array(["a", "b"]))
    assert "correct" in info["metrics"] and info["metrics"]["correct"].tolist() == [0.0, 0.0]  # keys stay


def test_exhausted_dataset_marks_no_episode_and_is_not_stepped():
    env = make(2, "test:Scripted-v0", env_kwargs='{"episodes": 1}')
    obs, info = env.reset(seed=0)
    assert not info["no_episode"].any()
    env.step(np.array(["a", "b"]))
    obs, info = env.reset(options={"reset_indices": [1]})
    assert info["no_episode"].tolist() == [False, True] and obs.text[1] == ""
    Recorder.stepped = []
    obs, reward, terminated, truncated, info = env.step(np.array(["a", "b"]))
    assert Recorder.stepped == [0]
    assert obs.text[1] == "" and reward[1] == 0 and not terminated[1] and not truncated[1]
    assert not info["action_is_valid"][1] and info["metrics"]["format_errors"][1] == 0


# ---------------------------------------------------------------------------------------------------- observations

def test_array_observations_become_images():
    env = make(2, "test:Image-v0")
    obs, _ = env.reset(seed=0)
    assert obs.images["image"].shape == (2, 4, 4, 3) and obs.images["image"].dtype == np.uint8
    assert (obs.images["image"] == 7).all() and obs.text.tolist() == ["", ""]
    obs, *_ = env.step(np.array(["a", "b"]))
    assert (obs.images["image"] == 3).all() and obs.text.tolist() == ["video", "video"]  # first frame of the video


def test_dict_observations_give_prompt_and_first_frame_and_zeros_when_missing():
    env = make(2, "test:Image-v0", env_kwargs='{"kind": "dict"}')
    obs, _ = env.reset(seed=0)
    assert obs.text.tolist() == ["what is shown?"] * 2 and (obs.images["image"] == 9).all()
    obs, *_ = env.step(np.array(["a", "b"]))
    assert obs.text.tolist() == ["text only now"] * 2 and "image" in obs.images and not obs.images["image"].any()


def test_gray_float_frames_are_converted():
    env = make(1, "test:Image-v0", env_kwargs='{"kind": "gray-float"}')
    obs, _ = env.reset(seed=0)
    assert obs.images["image"].shape == (1, 4, 4, 3) and (obs.images["image"] == 127).all()


def test_frames_of_different_sizes_are_an_error():
    env = make(2, "test:Image-v0")
    env.sub_envs[1].size = 5
    with pytest.raises(EnvContractError, match="one size"):
        env.reset(seed=0)


def test_rows_of_envs_not_reset_are_unchanged():
    env = make(3)
    env.reset(seed=2)
    obs, *_ = env.step(np.array(["\\boxed{2}", "\\boxed{3}", "\\boxed{4}"]))
    before = obs.text.copy()
    obs2, _ = env.reset(options={"reset_mask": np.array([False, True, False]), "reset_indices": np.array([1])})
    assert obs2.text[[0, 2]].tolist() == before[[0, 2]].tolist() and obs2.text[1] != before[1]


# ---------------------------------------------------------------------------------------------------- concurrency

def test_pool_runs_steps_concurrently_and_keeps_env_order():
    Recorder.barrier = threading.Barrier(4, timeout=30)  # broken (an error) unless all 4 steps overlap
    env = make(4, "test:Scripted-v0", max_concurrent=4, rng_isolation="reset")
    env.reset(seed=0)
    obs, *_ = env.step(np.array(["w", "x", "y", "z"]))
    assert obs.text.tolist() == ["0:w", "1:x", "2:y", "3:z"]
    env.close()


def test_pool_with_reset_isolation_keeps_episode_starts_reproducible():
    serial = make(4, "game:GuessTheNumber-v0-random")
    pooled = make(4, "game:GuessTheNumber-v0-random", max_concurrent=3, rng_isolation="reset")
    assert serial.reset(seed=21)[0].text.tolist() == pooled.reset(seed=21)[0].text.tolist()
    assert targets(serial) == targets(pooled)
    for _ in range(3):
        actions = np.array(["\\boxed{3}"] * 4)
        assert serial.step(actions)[0].text.tolist() == pooled.step(actions)[0].text.tolist()
    serial.close()
    pooled.close()


def test_thread_lock_is_held_during_sub_env_calls():
    env = make(2, "test:LockProbe-v0", use_thread_lock=True)
    env.reset(seed=0)
    env.step(np.array(["a", "b"]))
    assert Recorder.lock_free_during_step == [False, False]
    unlocked = make(1, "test:LockProbe-v0")
    unlocked.reset(seed=0)
    unlocked.step(np.array(["a"]))
    assert Recorder.lock_free_during_step[-1] is True


@pytest.mark.parametrize("config, match", [
    ({"max_concurrent": 2}, "--env.rng-isolation reset"),
    ({"max_concurrent": 2, "rng_isolation": "reset", "use_thread_lock": True}, "--env.use-thread-lock"),
    ({"max_concurrent": 0}, "--env.max-concurrent"),
    ({"env_kwargs": "{max_turns: 3}"}, "not valid JSON"),
    ({"env_kwargs": "[1, 2]"}, "JSON object"),
    ({"env_id": "game:GuessTheNumber-v0-eazy"}, "game:GuessTheNumber-v0-easy"),
    ({"env_id": "test:Strict-v0", "env_kwargs": '{"levle": 2}'}, "levle"),
])
def test_config_errors(config, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        GemEnv(GemEnvConfig(**config), num_envs=2)


def test_parse_env_kwargs():
    assert parse_env_kwargs('{"a": 1, "b": [2]}') == {"a": 1, "b": [2]}
    assert parse_env_kwargs("") == {}


# ---------------------------------------------------------------------------------------------------- close

def test_close_closes_each_sub_env_once_even_when_one_fails(caplog):
    Recorder.close_raises = {1: RuntimeError}
    env = make(3, "test:Scripted-v0")
    env.close()
    assert sorted(Recorder.closed) == [0, 1, 2]
    assert any("closing GEM sub-env 1" in r.getMessage() for r in caplog.records)
    env.close()
    assert sorted(Recorder.closed) == [0, 1, 2]


def test_close_after_a_sub_env_raised_in_step():
    Recorder.step_raises = {1}
    env = make(3, "test:Scripted-v0")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="tool crashed") as info:
        env.step(np.array(["a", "b", "c"]))
    if sys.version_info >= (3, 11):
        assert any("sub-env 1" in note for note in info.value.__notes__)
    env.close()
    assert sorted(Recorder.closed) == [0, 1, 2]


def test_keyboard_interrupt_while_closing_still_closes_the_rest():
    Recorder.close_raises = {0: KeyboardInterrupt}
    env = make(3, "test:Scripted-v0", max_concurrent=2, rng_isolation="off")
    with pytest.raises(KeyboardInterrupt):
        env.close()
    assert sorted(Recorder.closed) == [0, 1, 2]
    env.close()  # harmless: nothing is closed twice
    assert sorted(Recorder.closed) == [0, 1, 2]


def test_failed_construction_closes_the_envs_already_made():
    Recorder.make_raises_at = 2
    with pytest.raises(RuntimeError, match="cannot start"):
        make(4, "test:Scripted-v0")
    assert sorted(Recorder.closed) == [0, 1]


def test_registered():
    from plugrl_env_client.utils.registration import get_spec

    spec = get_spec("GEM-v1")
    assert spec.env_cls is GemEnv and spec.max_episode_steps is None
