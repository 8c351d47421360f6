"""The walk of one observation: the package modules it crosses from ``env.step``'s return to the socket's send.

Run from the repo root (no extra needed, about 2 s)::

    python bench/walk.py            # Point-v1 x16, lockstep, H=1, against the embedded random server
    python bench/walk.py --calls    # also: one feedback's calls by module, as cProfile counts them

A lockstep rollout (one :class:`~plugrl_env_client.rollout.group.EnvGroup`, a real session over loopback) runs in
this process. On a warm step it watches the calls made from the moment ``EnvGroup.step_envs`` is entered until the
feedback's frame goes to the socket (``socket.send``), with the profiling hook cProfile uses (``sys.setprofile``),
and follows the observation: the batch ``env.step`` returned is the first thing followed; a call that takes a
followed value as an argument (or a tuple, list, dict or dataclass holding one) takes the walk into its module, and
what it returns is followed too (a checked step, the rows of a feedback, its wire form, the message, the frame); a
function that returns a followed value hands it back to its caller's module. Compiled functions of the package
called on the walk (the framer) count as their module. The modules are listed in the order the observation first
reaches them, with the functions it passes through.

``--calls`` profiles a second step with cProfile (entered at ``step_envs``, left when the next ``finish_episodes``
starts) and lists every package module with calls in that window, the observation's or not (the helpers' too).

What it measures is a property of the code, not of the machine: load does not change it.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import pstats
import socket
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

import plugrl_env_client
from plugrl_env_client.envs import contract, discover_envs
from plugrl_env_client.envs.registry import get_spec, make_env
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter

try:
    from plugrl_env_client.protocol.dialing import SessionConfig
except ImportError:  # a tree whose session module held its config
    from plugrl_env_client.protocol.session import SessionConfig  # type: ignore[attr-defined,no-redef]
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.rollout.settings import LoopSettings
from plugrl_env_client.server.embedded import start_local_server

PACKAGE = str(Path(plugrl_env_client.__file__).parent) + "/"
_NOT_DERIVED = frozenset({type(None), bool, int, float, str, list, np.ndarray})
"""What a function that took the observation returns without handing it on: flags, counts, problem lists, arrays of
rewards or rows (the observation's own arrays are followed when they are, as such)."""
WARM_STEPS = 5
"""Steps taken before the one watched (connection, first reset and first-call caches behind)."""


def module_of(filename: str) -> str | None:
    """The package module a source file is (``rollout/group.py``), or None outside the package."""
    return filename[len(PACKAGE):] if filename.startswith(PACKAGE) else None


class Walk:
    """A profile function that follows one observation (see the module docstring)."""

    def __init__(self, step_code: Any) -> None:
        self.step_code = step_code  # the env's own step function: the walk starts at its return
        self.followed: dict[int, Any] = {}  # id -> value (kept alive, so that ids stay unique)
        self.walk_frames: set[int] = set()  # frames the observation entered
        self.modules: list[str] = []
        self.functions: dict[str, list[str]] = collections.defaultdict(list)
        self.sent = False

    def _follow(self, value: Any) -> None:
        self.followed[id(value)] = value

    def _holds(self, value: Any) -> bool:
        """Whether ``value`` is followed, or a container or dataclass one level above a followed value."""
        followed = self.followed
        if id(value) in followed:
            return True
        if isinstance(value, (tuple, list)):
            return any(id(v) in followed for v in value)
        if isinstance(value, dict):
            return any(id(v) in followed for v in value.values())
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(id(getattr(value, f.name, None)) in followed for f in dataclasses.fields(value))
        return False

    def _reach(self, module: str | None, where: str) -> None:
        if module is None:
            return
        if module not in self.modules:
            self.modules.append(module)
        if where not in self.functions[module]:
            self.functions[module].append(where)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.sent:
            return
        if event == "call":
            code = frame.f_code
            if not self.followed:
                return
            count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04)
            args = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
            if any(self._holds(a) for a in args):
                self.walk_frames.add(id(frame))
                self._reach(module_of(code.co_filename), code.co_name)
                if code.co_name == "__init__" and args and not self._holds(args[0]):
                    self._follow(args[0])  # a value built around the observation (a step's result, a feedback)
        elif event == "return":
            code = frame.f_code
            if code is self.step_code and not self.followed:
                self._follow(arg)
                if isinstance(arg, tuple) and arg:
                    self._follow(arg[0])  # the observation
                self._reach(module_of(frame.f_back.f_code.co_filename) if frame.f_back else None,
                            frame.f_back.f_code.co_name if frame.f_back else "")
                return
            if not self.followed:
                return
            on_walk = id(frame) in self.walk_frames
            self.walk_frames.discard(id(frame))
            if on_walk and type(arg) not in _NOT_DERIVED and not self._holds(arg) and not any(
                    arg is v for v in frame.f_locals.values()):
                self._follow(arg)  # built from the observation: its rows, its wire form, the message, the frame
            if arg is not None:
                caller = frame.f_back
                if caller is not None and self._holds(arg):
                    self._reach(module_of(code.co_filename), code.co_name)
                    self._reach(module_of(caller.f_code.co_filename), caller.f_code.co_name)
        elif event == "c_call":
            if not self.followed:
                return
            owner = getattr(arg, "__self__", None)
            if isinstance(owner, socket.socket) and getattr(arg, "__name__", "") in ("send", "sendall", "sendmsg"):
                self._reach(module_of(frame.f_code.co_filename), frame.f_code.co_name)
                self.modules.append("socket.send")
                self.sent = True
                return
            mod = getattr(arg, "__module__", None) or ""
            if mod.startswith("plugrl_env_client.") and id(frame) in self.walk_frames:
                self._reach(mod.replace(".", "/").removeprefix("plugrl_env_client/") + " (compiled)", arg.__name__)


@dataclasses.dataclass
class Result:
    """What :func:`run` saw: the observation's modules in order (with the functions it passed through), whether the
    frame reached the socket, and one step's package calls by module (``calls``, else empty)."""

    modules: list[str]
    functions: dict[str, list[str]]
    sent: bool
    calls: collections.Counter[str]


def run(horizon: int = 1, calls: bool = False) -> Result:
    """A lockstep rollout of Point-v1 x16 against the embedded random server, watched on one warm step (and, with
    ``calls``, profiled on the next)."""
    discover_envs()
    spec = get_spec("Point-v1")
    env = make_env(spec.uid, num_envs=16)
    server = start_local_server("random", contract.action_space_of(env), horizon, seed=0)
    budget = EpisodeBudget(None)
    walk = Walk(type(env).step.__code__)
    profiler = cProfile.Profile()
    steps = 0
    original_step, original_finish = EnvGroup.step_envs, EnvGroup.finish_episodes

    def step_envs(self: EnvGroup) -> Any:
        nonlocal steps
        steps += 1
        if steps == WARM_STEPS:
            sys.setprofile(walk)
        elif steps == WARM_STEPS + 1 and calls:
            profiler.enable()
        return original_step(self)

    def finish_episodes(self: EnvGroup, step: Any) -> Any:
        if steps == WARM_STEPS:
            sys.setprofile(None)
            if not calls:
                budget.stop.set()
        elif steps == WARM_STEPS + 1:
            profiler.disable()
            budget.stop.set()
        return original_finish(self, step)

    EnvGroup.step_envs, EnvGroup.finish_episodes = step_envs, finish_episodes  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="plugrl-walk-") as tmp:
            writer = RunWriter(RunDir(Path(tmp) / "run").create(), "walk", 1)
            session = Session(SessionConfig(url=server.url, connect_timeout=10))
            settings = LoopSettings(env_id=spec.uid, process_id=0, seed=0, max_episode_steps=spec.max_episode_steps,
                                    replan_steps=None, success_threshold=spec.best_reward_threshold_for_success)
            group = EnvGroup(env, session, settings, budget, writer, session.timing)
            try:
                Rollout([group], settings, budget, writer).run()
            finally:
                writer.close()
    finally:
        sys.setprofile(None)
        EnvGroup.step_envs, EnvGroup.finish_episodes = original_step, original_finish  # type: ignore[method-assign]
        server.shutdown()
        env.close()
    by_module: collections.Counter[str] = collections.Counter()
    if calls:
        for (filename, _, _), (_, count, *_rest) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
            module = module_of(filename)
            if module is not None and "/point/" not in module:
                by_module[module] += count
    return Result([m for m in walk.modules if m != "socket.send"], dict(walk.functions), walk.sent, by_module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--horizon", type=int, default=1, help="the server's action horizon (1: a feedback a step)")
    parser.add_argument("--calls", action="store_true", help="also count one step's calls by module (cProfile)")
    args = parser.parse_args()
    threading.current_thread().name = "walk"
    result = run(args.horizon, args.calls)
    print(f"the walk of one observation, env.step's return to socket.send (Point-v1 x16, lockstep, H={args.horizon}): "
          f"{len(result.modules)} package modules" + ("" if result.sent else " (NO SEND SEEN: the feedback was held)"))
    for i, module in enumerate(result.modules, 1):
        print(f"  {i:2d}. {module:<34} {', '.join(result.functions[module])}")
    if args.calls:
        print(f"\none step's package calls by module (cProfile, step_envs to finish_episodes): "
              f"{sum(result.calls.values())} in {len(result.calls)} modules")
        for module, count in result.calls.most_common():
            print(f"  {count:4d} {module}")


if __name__ == "__main__":
    main()
