"""What an env must keep from call to call, checked while the rollout runs: the observation's layout, and the rows a
partial reset was not asked to reset.

Most tests drive a real :class:`EnvGroup` against the in-memory server (``fake_server``) with a scripted env
(``scripted_env``) broken in one way, and look at what the server got: a broken env stops the run before its
observation is sent. Two runs go over real sockets (``run_client``), as a user's run does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import broken_envs
import gymnasium as gym
import numpy as np
import pytest
from fake_server import FakeServer, MemoryBudget, MemorySink, loop_settings
from scripted_env import ScriptedEnv, by_env

from plugrl_env_client.app import run_client
from plugrl_env_client.check import check_env
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.contract import ObservationSignature, PartialResetCheck, partial_reset_problem
from plugrl_env_client.envs.registry import register_env
from plugrl_env_client.errors import EnvContractError
from plugrl_env_client.records import ProcessStatus
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.timing import Timing

FIX = "reset only the rows of `mask = self.reset_mask(options)`"


@dataclasses.dataclass
class Run:
    status: ProcessStatus
    server: FakeServer
    sink: MemorySink


def run(env: BaseEnv, server: FakeServer | None = None, episodes: int | None = 12, **overrides: Any) -> Run:
    """One group's rollout to its end (``episodes`` recorded, every env retired, or an error raised)."""
    server = server if server is not None else FakeServer()
    budget, sink, chosen = MemoryBudget(episodes), MemorySink(), loop_settings(**overrides)
    group = EnvGroup(env, server.session(), chosen, budget, sink, Timing())
    status = Rollout([group], chosen, budget, sink).run()
    return Run(status, server, sink)


def stopped(env: BaseEnv, server: FakeServer | None = None, **overrides: Any) -> tuple[str, FakeServer]:
    """Run ``env`` expecting its run to stop with an :class:`EnvContractError`: (the message, the server)."""
    server = server if server is not None else FakeServer()
    with pytest.raises(EnvContractError) as err:
        run(env, server, **overrides)
    return str(err.value), server


# ================================================================================================ layout


class ChangedStep(ScriptedEnv):
    """A scripted env whose ``step`` (or, with ``resets``, every reset after the first instead) returns its
    observation through ``change``."""

    def __init__(self, num_envs: int, change: Callable[[Observation], Observation], resets: bool = False,
                 images: bool = False, **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.change, self.change_resets, self.images = change, resets, images

    def obs(self) -> Observation:
        obs = super().obs()
        if self.images:
            obs.images = {"cam": np.zeros((self.num_envs, 4, 4, 3), np.uint8)}
        return obs

    def step(self, actions: np.ndarray) -> Any:
        obs, *rest = super().step(actions)
        return (obs if self.change_resets else self.change(obs), *rest)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        return (self.change(obs) if self.change_resets and len(self.resets) > 1 else obs), info


def _with(obs: Observation, images: dict[str, np.ndarray] | None = None, **states: np.ndarray | None) -> Observation:
    out = Observation.__new__(Observation)
    out.images = dict(obs.images) if images is None else images
    out.states = {k: v for k, v in {**obs.states, **states}.items() if v is not None}
    out.text = obs.text
    return out


LAYOUT_CASES: dict[str, tuple[Callable[[Observation], Observation], str]] = {
    "shape": (lambda o: _with(o, a=np.zeros((3, 2))),
              "step() returned states['a'] of shape (3, 2) where the first reset() returned (3, 1)"),
    "dtype": (lambda o: _with(o, t=o.states["t"].astype(np.float32)),
              "step() returned states['t'] of dtype float32 where the first reset() returned float64"),
    "key appears": (lambda o: _with(o, extra=np.zeros((3, 1))),
                    "step() returned states['extra'], which the first reset() did not"),
    "key disappears": (lambda o: _with(o, a=None), "step() returned no states['a'], which the first reset() returned"),
    "image size": (lambda o: _with(o, images={"cam": np.zeros((3, 4, 5, 3), np.uint8)}),
                   "step() returned images['cam'] of shape (3, 4, 5, 3) where the first reset() returned (3, 4, 4, 3)"),
    "image gone": (lambda o: _with(o, images={}), "step() returned no images['cam'], which the first reset() returned"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_a_step_whose_layout_differs_from_the_first_reset_stops_before_it_is_sent(case: str) -> None:
    change, expected = LAYOUT_CASES[case]
    message, server = stopped(ChangedStep(3, change, images=True))
    assert message.startswith(f"env Scripted-v0: {expected}: an env returns the same observation keys"), message
    assert len(server.infers) == 1 and not server.feedbacks, "the first step's observation never reached the server"


def test_a_later_reset_whose_layout_differs_names_the_reset() -> None:
    message, server = stopped(ChangedStep(3, lambda o: _with(o, a=np.zeros((3, 2))), resets=True))
    assert "reset() returned states['a'] of shape (3, 2) where the first reset() returned (3, 1)" in message
    assert all(m.obs.states["a"].shape[1:] == (1,) for m in server.infers + server.feedbacks)


def test_every_change_is_named_in_one_message() -> None:
    message, _ = stopped(ChangedStep(3, lambda o: _with(o, a=np.zeros((3, 2)), env=None, t=o.states["t"].astype(int))))
    assert ("step() returned no states['env'], which the first reset() returned; step() returned states['t'] of "
            "dtype int64 where the first reset() returned float64; step() returned states['a'] of shape (3, 2) "
            "where the first reset() returned (3, 1): ") in message


def test_the_same_arrays_in_another_order_are_the_same_layout() -> None:
    def reorder(obs: Observation) -> Observation:
        out = _with(obs)
        out.states = dict(reversed(list(obs.states.items())))
        return out

    r = run(ChangedStep(3, reorder), episodes=9)
    assert r.status is ProcessStatus.FINISHED and len(r.sink.episodes) == 9


def _text(value: str) -> Callable[[Observation], Observation]:
    def change(obs: Observation) -> Observation:
        out = _with(obs)
        out.text = np.full(obs.batch_size, value)
        return out

    return change


def test_a_step_that_drops_the_text_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        r = run(ChangedStep(3, _text(""), text=True), episodes=9)
    assert r.status is ProcessStatus.FINISHED
    warned = [rec.getMessage() for rec in caplog.records if "returned no text" in rec.getMessage()]
    assert warned == ["step() returned no text (an empty string for every env) where the first reset() returned "
                      "text: a policy that reads text gets empty prompts; return the text on every step"]


def test_text_that_appears_after_an_empty_first_observation_is_fine(caplog: pytest.LogCaptureFixture) -> None:
    """Envs leave the first text empty on purpose (the instruction comes in info['env_instruction'])."""
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        r = run(ChangedStep(3, _text("go on")), episodes=6)
    assert r.status is ProcessStatus.FINISHED and not caplog.records


# ------------------------------------------------------------------------------------------------ the signature alone


def obs(**states: np.ndarray) -> Observation:
    return Observation(states=states)


def test_signature_compares_shapes_dtypes_and_keys_but_not_values() -> None:
    sig = ObservationSignature()
    sig.check(obs(x=np.zeros((2, 3)), y=np.zeros((2,), np.int64)), "reset()")
    sig.check(obs(x=np.ones((2, 3)), y=np.arange(2)), "step()")
    sig.check(obs(y=np.arange(2), x=np.ones((2, 3))), "step()")  # order alone
    with pytest.raises(EnvContractError, match=r"step\(\) returned states\['x'\] of shape \(2, 2\) where the first "
                                               r"reset\(\) returned \(2, 3\)"):
        sig.check(obs(x=np.zeros((2, 2)), y=np.arange(2)), "step()")


# ================================================================================================ partial resets


class OthersTouched(ScriptedEnv):
    """A scripted env whose partial resets also change ``states['a']`` of the rows ``touched(mask)`` picks."""

    def __init__(self, num_envs: int, touched: Callable[[ScriptedEnv, np.ndarray], np.ndarray], **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.touched = touched

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        if options is not None:
            rows = self.touched(self, self.reset_mask(options))
            self.last_action[rows] = 0.5
            obs = self.obs()
        return obs, info


def every_other_row(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
    return ~mask


def test_a_partial_reset_that_changes_other_rows_stops_the_run_with_rule_8s_message() -> None:
    """Episodes of 3, 5 and 4 steps: env 0's reset after step 3 also changes rows 1 and 2."""
    message, server = stopped(OthersTouched(3, every_other_row))
    assert message == ("env Scripted-v0: resetting envs [0] changed rows it was not asked to reset: states['a'] in "
                       f"envs [1, 2]: {FIX} (options['reset_mask'] or options['reset_indices']) and leave the others "
                       "as they are (checked after every partial reset; --runner.check-partial-reset off skips the "
                       "check)")
    assert all((m.obs.states["a"] != 0.5).all() for m in server.infers), "the changed rows were never sent"


def test_check_partial_reset_off_lets_such_an_env_run() -> None:
    r = run(OthersTouched(3, every_other_row), check_partial_reset="off")
    assert r.status is ProcessStatus.FINISHED and len(r.sink.episodes) == 12


def test_rows_not_reset_must_equal_the_step_before_not_the_reset_before() -> None:
    """An env that gives back the rows it did not reset as they were at the previous reset (a cached start)."""

    class StaleRows(ScriptedEnv):
        cached: Observation | None = None

        def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
            obs, info = super().reset(seed=seed, options=options)
            if self.cached is not None:
                keep = ~self.reset_mask(options)
                for key in obs.states:
                    obs.states[key][keep] = self.cached.states[key][keep]
            self.cached = obs
            return obs, info

    message, _ = stopped(StaleRows(3))
    assert "resetting envs [0] changed rows it was not asked to reset: states['a'] in envs [1, 2]; states['t'] in " \
           "envs [1, 2]: " in message


class BufferEnv(BaseEnv[BaseEnvConfig]):
    """Returns its own buffer as the observation (no copy) and re-randomises every row, in place, on any reset."""

    def __init__(self, num_envs: int = 3) -> None:
        super().__init__(BaseEnvConfig(), num_envs=num_envs)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.pos = np.zeros((num_envs, 1))
        self.t = np.zeros(num_envs)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        self.seed_rngs(seed)
        self.pos[:] = self.np_random.uniform(-1.0, 1.0, self.pos.shape)
        self.t[self.reset_mask(options)] = 0
        return Observation(states={"pos": self.pos}), {}

    def step(self, actions: np.ndarray) -> Any:
        self.pos += 1e-3 * np.asarray(actions).reshape(self.pos.shape)
        self.t += 1
        n = self.num_envs
        return Observation(states={"pos": self.pos}), np.zeros(n, np.float32), self.t >= 2 + np.arange(n), \
            np.zeros(n, bool), {}


def test_an_env_that_changes_its_returned_buffers_in_place_is_caught_too() -> None:
    """The rows kept are copied before the reset runs: the env's earlier observation is the buffer it writes to."""
    message, _ = stopped(BufferEnv(3), seed=0)
    assert "resetting envs [0] changed rows it was not asked to reset: states['pos'] in envs [1, 2]" in message


def test_waiting_members_of_a_seed_group_are_not_the_resets_to_change() -> None:
    """Seed groups of 2, episodes of 2 and 4 steps: envs 0 and 2 end first and are reset alone while their group
    mates play on; an env that resets the whole group then changes rows 1 and 3."""

    def group_mates(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(mask)
        return np.setdiff1d(rows ^ 1, rows)

    env = OthersTouched(4, group_mates, length=by_env([2, 4]), per_env_seeds=True)
    message, _ = stopped(env, seed=1, group_size=2)
    assert "resetting envs [0, 2] changed rows it was not asked to reset: states['a'] in envs [1, 3]" in message


def test_retired_rows_are_not_the_resets_to_change() -> None:
    """Env 0 has one episode: its second reset retires it; the next reset (env 2's) must leave its row alone."""

    def retired(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
        return ~mask & ~env.live

    env = OthersTouched(3, retired, length=by_env([3, 9, 4]), episodes_per_env=[1, 3, 3])
    message, _ = stopped(env, group_size=1)
    assert "resetting envs [2] changed rows it was not asked to reset: states['a'] in envs [0]" in message


@pytest.mark.parametrize("case", ["seed-groups", "retirement", "seed-groups-retirement"])
def test_envs_that_keep_their_other_rows_run_through_with_seed_groups_and_retirement(case: str) -> None:
    kwargs = {"seed-groups": dict(per_env_seeds=True), "retirement": dict(episodes_per_env=[1, 3, 2, 2]),
              "seed-groups-retirement": dict(per_env_seeds=True, episodes_per_env=2)}[case]
    env = ScriptedEnv(4, lambda e, k: 2 + (5 * e + k) % 4, **kwargs)
    r = run(env, episodes=None if "episodes_per_env" in kwargs else 16, seed=2,
            group_size=2 if kwargs.get("per_env_seeds") else 1)
    assert r.status is ProcessStatus.FINISHED and r.sink.episodes


def test_partial_reset_check_alone_treats_nan_as_equal_and_leaves_reset_rows_free() -> None:
    check = PartialResetCheck()
    check.seen(obs(x=np.array([[np.nan, 1.0], [2.0, 3.0], [4.0, 5.0]]), k=np.arange(3)))
    check.before(np.array([False, True, False]))
    assert check.after(obs(x=np.array([[np.nan, 1.0], [9.0, 9.0], [4.0, 5.0]]), k=np.array([0, 7, 2]))) is None
    check.before(np.array([True, False, False]))
    problem = check.after(obs(x=np.array([[0.0, 0.0], [9.0, 9.0], [4.0, 6.0]]), k=np.array([0, 8, 2])))
    assert problem is not None
    assert problem.seen == ("resetting envs [0] changed rows it was not asked to reset: states['k'] in envs [1]; "
                            "states['x'] in envs [2]")


# ------------------------------------------------------------------------------------------------ one rule, two callers


@pytest.mark.slow
@pytest.mark.parametrize("cls, reset, changed", [
    (broken_envs.ResetAllEnv, 0, 1),  # env 0's episode ends first (3 steps); its reset resets env 1 too
    (broken_envs.ResetFirstRowsEnv, 1, 0),  # then env 1's (4 steps): its reset resets env 0 instead
])
def test_the_run_and_plugrl_check_env_say_rule_8_in_the_same_words(cls: type[broken_envs.GoodEnv], reset: int,
                                                                   changed: int) -> None:
    checked = check_env(cls()).result(8)
    rule = partial_reset_problem([1], ["states['pos'] in envs [0]", "states['t'] in envs [0]"])
    assert (checked.status, checked.seen, checked.fix) == ("fail", rule.seen, rule.fix)
    message, _ = stopped(cls(), FakeServer(action_shape=(2,)), env_id="Broken-v0")
    ran = partial_reset_problem([reset], [f"states['pos'] in envs [{changed}]", f"states['t'] in envs [{changed}]"])
    assert message.startswith(f"env Broken-v0: {ran.message} ("), message


# ================================================================================================ whole runs


class ReshapedEnv(BaseEnv[BaseEnvConfig]):
    """``states['x']`` of (n, 3) from reset, (n, 2) from step."""

    def __init__(self, config: BaseEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        return Observation(states={"x": np.zeros((self.num_envs, 3))}), {}

    def step(self, actions: np.ndarray) -> Any:
        n = self.num_envs
        return Observation(states={"x": np.zeros((n, 2))}), np.zeros(n, np.float32), np.ones(n, bool), \
            np.zeros(n, bool), {}


class RerandomisingEnv(broken_envs.GoodEnv):
    """Every reset re-randomises every row (as if the mask were not there)."""

    def __init__(self, config: BaseEnvConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(None, num_envs=num_envs, **kwargs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed, options=None)


def client(tmp_path: Path, **kwargs: Any) -> ClientConfig:
    values: dict[str, Any] = dict(output_dir=tmp_path, exp_name="run", progress=False, num_envs=2, num_episodes=4,
                                  local_policy="random")
    return ClientConfig(**{**values, **kwargs})


def test_a_run_whose_env_changes_its_layout_fails_naming_the_key(registry: None, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    register_env("Reshaped-v1")(ReshapedEnv)
    assert run_client(client(tmp_path), "Reshaped-v1") == 1
    err = capsys.readouterr().err
    assert "error: process 0 failed: env Reshaped-v1: step() returned states['x'] of shape (2, 2) where the first " \
           "reset() returned (2, 3)" in err, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["completed_episodes"] == 0


def test_a_run_whose_env_rerandomises_every_row_fails_unless_told_not_to_check(
        registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_env("Rerandomising-v1")(RerandomisingEnv)
    assert run_client(client(tmp_path), "Rerandomising-v1") == 1
    err = capsys.readouterr().err
    assert "env Rerandomising-v1: resetting envs [0] changed rows it was not asked to reset: states['pos'] in envs " \
           "[1]; states['t'] in envs [1]: reset only the rows" in err, err
    assert "--runner.check-partial-reset off" in err
    # Shared split: under the static one an env that ran its share is idle, its row is reset whenever it ends, and
    # this env's resets would restart the other env's episode every time.
    off = client(tmp_path, exp_name="off", runner=RunnerConfig(check_partial_reset="off", episode_split="shared"))
    assert run_client(off, "Rerandomising-v1") == 0


# ------------------------------------------------------------------------------------------------ lone surrogates


def test_text_without_a_lone_surrogate_is_left_as_it_is(caplog) -> None:
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    obs = Observation(states={"x": np.zeros((2, 1))}, text=["plain", "\U0001f600 and \ud7ff and \ue000"])
    text = obs.text
    info = {"env_instruction": ["go", "go"], "metrics": {"m": np.ones(2)}, "tags": np.array(["a", "b"]), 3: "x"}
    check.observation(obs)
    assert obs.text is text and check.info(info) is info and not caplog.records


def test_lone_surrogates_become_u_fffd_with_one_warning_per_field(caplog) -> None:
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    env_text = np.array(["a\ud800b", "ok"])
    obs = Observation(text=env_text)
    info = {"env_instruction": ("go\udfff", "fine"), "metrics": {"score\udc80": np.ones(2)},
            "tags": np.array(["\ud800", "t"]), "note": "n\ud801"}
    for _ in range(2):
        check.observation(obs)
        fixed = check.info(info)
    assert obs.text.tolist() == ["a\ufffdb", "ok"] and env_text[0] == "a\ud800b", "the env's array is not written to"
    assert fixed["env_instruction"] == ("go\ufffd", "fine") and list(fixed["metrics"]) == ["score\ufffd"]
    assert fixed["tags"].tolist() == ["\ufffd", "t"] and fixed["note"] == "n\ufffd"
    assert list(info["metrics"]) == ["score\udc80"], "the env's info is not written to"
    fields = ["the observation's text", "info['env_instruction']", "a key of info['metrics']", "info['tags']",
              "info['note']"]
    assert sorted(r.getMessage() for r in caplog.records) == sorted(
        f"env E-v1 returned a lone surrogate (half of a UTF-16 pair, which no UTF-8 file or message can hold) in "
        f"{field}; each one is replaced by U+FFFD" for field in fields)


@pytest.mark.parametrize("rows, width, order", [(2, 3, "<"), (2, 3, ">"), (300, 20, "<"), (300, 20, ">")])
def test_lone_surrogates_are_found_in_small_and_big_batches_of_either_byte_order(rows, width, order) -> None:
    """Small batches are checked by decoding them, big ones by a reduction; a byte-swapped '>U' array is read as
    code points, not as its raw bytes."""
    from plugrl_env_client.envs.contract import TextCheck

    text = np.array(["x" * (width - 1)] * rows, dtype=f"{order}U{width}")
    text[rows // 2] = "y\ud800"
    obs = Observation(text=text)
    TextCheck("E-v1").observation(obs)
    assert obs.text[rows // 2] == "y\ufffd" and obs.text[0] == "x" * (width - 1)
    clean = Observation(text=np.array(["x" * (width - 1)] * rows, dtype=f"{order}U{width}"))
    kept = clean.text
    TextCheck("E-v1").observation(clean)
    assert clean.text is kept


def test_a_text_seen_clean_is_passed_over_and_a_new_one_is_still_fixed(caplog) -> None:
    """Short str values that come back step after step (a metric's mode) are looked at once; a new value, or the
    same key with another value, is checked again, also deep in the info, and named by its path."""
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    info = {"metrics_agg_mode": {"score": "mean"}, "tag": "t"}
    for _ in range(3):
        assert check.info(info) is info
    fixed = check.info({"metrics_agg_mode": {"score": "me\ud800"}, "tag": "t"})
    assert fixed["metrics_agg_mode"] == {"score": "me\ufffd"} and fixed["tag"] == "t"
    assert [r.getMessage().split(" in ")[1] for r in caplog.records] == [
        "info['metrics_agg_mode']['score']; each one is replaced by U+FFFD"]
    assert check.info(info) is info
