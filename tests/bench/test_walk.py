"""bench/walk.py: the walk of one observation from ``env.step``'s return to the socket's send. The step is a pipe:
on the client's side the observation passes through the env group and the env contract only (the loop, the env
call's wrapper, the helpers and the hooks see none of it) before the wire (protocol/ and the WebSocket layer under
it), and the whole walk crosses at most 8 package modules.
A real rollout against the embedded server on 127.0.0.1; no figure of time is asserted."""

from __future__ import annotations

import pytest
from file_modules import bench_script

MAX_MODULES = 8


@pytest.fixture(scope="module")
def walk():
    with bench_script("walk") as module:
        yield module


@pytest.mark.slow
def test_one_observation_crosses_the_group_the_contract_and_the_wire_only(walk) -> None:
    result = walk.run(horizon=1)
    assert result.sent, "the watched step's feedback never reached the socket"
    client_side = [m for m in result.modules if not m.startswith(("protocol/", "websocket/"))]
    assert client_side == ["rollout/group.py", "envs/contract.py"], result.modules
    assert len(result.modules) <= MAX_MODULES, result.modules


@pytest.mark.slow
def test_the_walk_sees_a_module_the_observation_is_handed_to(walk, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: a group that hands the step's observation to a helper of another module shows it."""
    from plugrl_env_client.rollout import group as group_module
    from plugrl_env_client.rollout.interfaces import NoHooks

    original = group_module.EnvGroup.step_envs

    def step_envs(self):  # the observation goes to the (do-nothing) hooks, as a recorder's run sends it
        step = original(self)
        NoHooks().on_step(step.obs, step.rewards, step.rewards, self.ids)
        return step

    monkeypatch.setattr(group_module.EnvGroup, "step_envs", step_envs)
    result = walk.run(horizon=1)
    assert "rollout/interfaces.py" in result.modules
