"""docs/custom-environments.md stays true: its commands run, its error messages are real, its code is on disk.

* Every command of the guide's ```bash blocks runs, in order and in one scratch folder, as a reader following the
  guide would, and ends with the exit code the guide says; an output the guide shows is the real one.
* Every message excerpt of the troubleshooting table comes out of a real run: one small broken env, or one
  command, per problem. An excerpt no run produces fails, and so does a run whose message the table lost.
* Code blocks the guide marks as a file (``<!-- file: path -->``) are that file, blocks marked as an excerpt
  (``<!-- excerpt: path -->``) are consecutive lines of it, and every file of docs/examples is shown in full.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from children import sigint_default
from doc_commands import (
    Command,
    DocShell,
    Result,
    bash_blocks,
    check_quoted_messages,
    code_block_problems,
    code_spans,
    fence_marker,
    fenced_blocks,
    table_cells,
    table_excerpts,
)
from file_modules import imported

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.utils.registration import make_env

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "custom-environments.md"
EXAMPLES = ROOT / "docs" / "examples"
TROUBLESHOOTING = "## 8. Troubleshooting"
MIN_EXCERPT = 15
"""Shorter excerpts would be found in almost any output."""

SITECUSTOMIZE = '''\
"""Make this folder a site folder: pip installs the plugin here (pip install --target), and its .pth files must
run."""
import os
import site

site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
'''


def pip_environment(site: Path) -> dict[str, str]:
    """What the block that installs the plugin runs with: ``site`` (where the shell's ``pip install`` puts it,
    a throwaway folder gone with the test's) first on the import path of its commands, and pip quiet about its
    own version. The plugin's dependencies are installed already."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


# ================================================================================================ the commands


@pytest.mark.slow
def test_every_command_of_the_guide_runs(tmp_path: Path) -> None:
    examples = tmp_path / "examples"  # a copy: pip writes its build files next to the sources
    shutil.copytree(EXAMPLES, examples, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    replace = {"docs/examples": str(examples)}
    blocks = bash_blocks(GUIDE)
    results: list[Result] = []
    with DocShell(tmp_path / "work", tmp_path / "runs", replace=replace, pip_target=site) as shell:
        for block in blocks:
            installs = any("pip install" in c.text for c in block.commands)
            results += shell.run_block(block, pip_environment(site) if installs else None)
    failures = [r.describe() for r in results if not r.ok]
    assert not failures, "\n\n".join(failures)
    assert {r.command for r in results} == {c for b in blocks for c in b.commands}
    # every client run that the guide says works wrote its run folder where the shell asked
    clients = [r.command.text for r in results if r.prepared.kind == "client" and r.command.expected_exit == 0]
    runs = list((tmp_path / "runs").glob("*/summary.json"))
    assert len(runs) == len(clients) >= 8, (sorted(p.parent.name for p in runs), clients)


def test_the_guide_shows_every_way_to_run_and_check_an_env() -> None:
    ran = "\n".join(c.text for b in bash_blocks(GUIDE) for c in b.commands)
    for needed in ("python my_env.py my-v1", "--env-path docs/examples/cart_env.py", "--env-path docs/examples ",
                   "PLUGRL_ENV_PATH=", "docs/examples/cart_env.py:Cart-v1", "cart_env:Cart-v1",
                   "pip install -e docs/examples", "plugrl-check-env my-v1", "--local-policy random",
                   "--local-policy text", "plugrl-run-policy-server --port 8000 --policy.action-dim 2",
                   "--server-port 8000", "--help"):
        assert needed in ran, needed
    outputs = [c for b in bash_blocks(GUIDE) for c in b.commands if c.output is not None]
    assert [c.text for c in outputs] == ["plugrl-check-env my-v1 --env-path my_env.py"]
    failing = [(c.text.split("#")[0].strip(), c.expected_exit) for b in bash_blocks(GUIDE) for c in b.commands
               if c.expected_exit != 0]
    assert failing == [("plugrl-run-env-client cart-v1 --num-episodes 3 --local-policy random", 1)]


# ================================================================================================ the troubleshooting table

BASE_ENV = '''\
import dataclasses

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@dataclasses.dataclass
class MyConfig(BaseEnvConfig):
    speed: float = 0.1


class GoodEnv(BaseEnv[MyConfig]):
    def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros((num_envs, 2))

    def observe(self):
        return Observation(states={"pos": self.pos.copy()}, text="go")

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.pos[mask] = self.np_random.uniform(-1.0, 1.0, (int(mask.sum()), 2))
        return self.observe(), {}

    def step(self, actions):
        self.pos += self.config.speed * actions
        n = self.num_envs
        return self.observe(), np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), {}

'''
"""A correct env with no success rule; each broken env below registers ``My-v1`` as a variation of it."""

STEP_OVERRIDE = '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def step(self, actions):
        obs, reward, terminated, truncated, info = super().step(actions)
        {body}
'''
OBSERVE_OVERRIDE = '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def observe(self):
        {body}
'''
GOOD = '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    pass
'''

RUN = "plugrl-run-env-client my-v1 --env-path my_env.py --num-envs 2 --num-episodes 1 --local-policy random " \
      "--runner.max-episode-steps 5"


@dataclasses.dataclass(frozen=True)
class Trigger:
    """A run that makes the client print one troubleshooting message: ``my_env.py`` holds ``env`` (when given)
    and ``commands`` run in its folder; the last one ends with ``exit_code``."""

    name: str
    env: str | None
    commands: tuple[str, ...] = (RUN,)
    exit_code: int = 1


def _step(body: str) -> str:
    return BASE_ENV + STEP_OVERRIDE.format(body=body)


def _observe(body: str) -> str:
    return BASE_ENV + OBSERVE_OVERRIDE.format(body=body)


TRIGGERS = (
    Trigger("too few values", _step("return obs, reward, terminated")),
    Trigger("old gym API", _step("return obs, reward, terminated | truncated, info")),
    Trigger("bare observation from reset", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)[0]
'''),
    Trigger("array instead of an Observation", _step('return obs.states["pos"], reward, terminated, truncated, info')),
    Trigger("one reward for the batch", _step("return obs, float(reward.sum()), terminated, truncated, info")),
    Trigger("integer flags", _step("return obs, reward, terminated.astype(int), truncated, info")),
    Trigger("one env's rows", _observe('return Observation(states={"pos": self.pos[:1].copy()})')),
    Trigger("mixed batch sizes", _observe('return Observation(states={"pos": self.pos.copy(), "time": np.zeros(1)})')),
    Trigger("scalar state", _observe('return Observation(states={"pos": self.pos.copy(), "time": np.float64(0)})')),
    Trigger("NaN reward", _step("reward[1] = np.nan\n        return obs, reward, terminated, truncated, info")),
    Trigger("inf state",
            _step('obs.states["pos"][0] = np.inf\n        return obs, reward, terminated, truncated, info')),
    Trigger("float image", _observe('return Observation(images={"camera": np.zeros((self.num_envs, 8, 8, 3), '
                                    'np.float32)}, states={"pos": self.pos.copy()})')),
    Trigger("one metric value for the batch",
            _step('info = {"metrics": {"distance": 1.0}}\n        return obs, reward, terminated, truncated, info')),
    Trigger("no action space", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        del self.__dict__["_single_action_space"]  # as if __init__ never set it
'''),
    Trigger("server with another action dim", BASE_ENV + GOOD, (
        "plugrl-run-policy-server --port 8000",
        "plugrl-run-env-client my-v1 --env-path my_env.py --num-episodes 1 --server-port 8000",
    )),
    Trigger("seed groups for an env without per-env seeds", BASE_ENV + GOOD, (RUN + " --runner.group-size 2",)),
    Trigger("random policy for a text env", None,
            ("plugrl-run-env-client guessnumber-v1 --num-episodes 1 --local-policy random",)),
    Trigger("env file not imported", BASE_ENV + GOOD,
            ("plugrl-run-env-client my-v1 --num-episodes 1 --local-policy random",)),
    Trigger("env file that fails to import", BASE_ENV + "import mysim\n" + GOOD),
    Trigger("config registered under another id", BASE_ENV + '''
@register_env_config("My-v0")
@dataclasses.dataclass
class MyOtherConfig(BaseEnvConfig):
    speed: float = 0.1


@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config: MyOtherConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
'''),
    Trigger("config field without a default", BASE_ENV + '''
@register_env_config("My-v1")
@dataclasses.dataclass
class SceneConfig(BaseEnvConfig):
    scene: str
''' + GOOD),
    Trigger("id of a built-in", BASE_ENV + GOOD.replace("My-v1", "Point-v1")),
    Trigger("kwargs JSON cannot write", BASE_ENV + GOOD.replace('"My-v1"', '"My-v1", scale=np.float32(2.0)')),
    Trigger("old constructor", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config, num_envs, worker_id, total_workers):
        super().__init__(config, num_envs=num_envs)
'''),
    Trigger("raises in __init__", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs):
        raise OSError("simulator license not found")
'''),
    Trigger("raises in reset", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("scene file missing")
'''),
    Trigger("raises in step", _step('raise RuntimeError("solver diverged")')),
    Trigger("no server", BASE_ENV + GOOD, (
        "plugrl-run-env-client my-v1 --env-path my_env.py --num-episodes 1 --server-port 8000 --connect-timeout 1",
    )),
    Trigger("no success rule", BASE_ENV + GOOD, exit_code=0),
    Trigger("layout that changes", _step('obs.states["pos"] = np.zeros((self.num_envs, 3))\n'
                                         "        return obs, reward, terminated, truncated, info")),
    Trigger("partial reset of every row", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        self.pos[:] = self.np_random.uniform(-1.0, 1.0, self.pos.shape)  # every row, whatever the mask
        return self.observe(), {}

    def step(self, actions):
        obs, reward, terminated, truncated, info = super().step(actions)
        return obs, reward, np.arange(self.num_envs) == 0, truncated, info  # env 0's episodes last one step
''', (RUN.replace("--num-episodes 1", "--num-episodes 4"),)),
    Trigger("server actions outside a discrete space", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Discrete(2)
''', ("plugrl-run-policy-server --port 8000 --policy.action-dim 0 --policy.dtype int64 --policy.low 5 --policy.high 5",
        "plugrl-run-env-client my-v1 --env-path my_env.py --num-envs 2 --num-episodes 2 --server-port 8000")),
    Trigger("success as a list", _step('info = {"success": [False] * self.num_envs}\n'
                                       "        return obs, reward, terminated, truncated, info"), exit_code=0),
    Trigger("close that raises", BASE_ENV + '''
@register_env("My-v1")
class MyEnv(GoodEnv):
    def close(self):
        raise RuntimeError("simulator already gone")
''', exit_code=0),
    Trigger("thread that never ends", BASE_ENV + '''
import threading


@register_env("My-v1")
class MyEnv(GoodEnv):
    def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        threading.Thread(target=threading.Event().wait, name="sim-worker").start()
''', exit_code=0),
)


def run_trigger(trigger: Trigger, folder: Path) -> tuple[list[Result], str]:
    """Run ``trigger`` in ``folder``; its results and everything it printed."""
    if trigger.env is not None:
        folder.mkdir(parents=True)
        (folder / "my_env.py").write_text(trigger.env)
    commands = [Command(Path(trigger.name), k + 1, text, trigger.exit_code if k == len(trigger.commands) - 1 else 0)
                for k, text in enumerate(trigger.commands)]
    with DocShell(folder, folder / "runs", timeout_s=120) as shell:
        results = [shell.run(c) for c in commands] + shell.stop_background()
    return results, "\n".join(r.stdout + r.stderr for r in results)


@pytest.mark.slow
def test_every_troubleshooting_message_is_real(tmp_path: Path) -> None:
    runs = {t.name: functools.partial(run_trigger, t, tmp_path / f"t{k:02d}") for k, t in enumerate(TRIGGERS)}
    check_quoted_messages(table_excerpts(GUIDE, TROUBLESHOOTING), runs, MIN_EXCERPT)


def test_table_excerpts_are_read_from_the_first_column() -> None:
    row = "| `a | b` and `c` | cause with `code` | fix |"
    assert table_cells(row) == ["`a | b` and `c`", "cause with `code`", "fix"]
    assert code_spans(table_cells(row)[0]) == ["a | b", "c"]
    assert code_spans("`` a `tick` ``") == ["a `tick`"]


# ================================================================================================ code on disk


def test_code_blocks_are_the_files_on_disk() -> None:
    shown, problems = code_block_problems(GUIDE, ROOT)
    for fence in fenced_blocks(GUIDE):
        if fence.language == "python" and not fence_marker(fence)[0] and "__main__" in fence.body:
            problems.append(f"{GUIDE.name}:{fence.line}: a complete env file must be one on disk (<!-- file: path -->)")
    assert not problems, "\n".join(problems)
    for other in sorted((ROOT / "docs").glob("*.md")):  # an example file may be shown in full by another guide
        shown.update(rel for kind, rel in map(fence_marker, fenced_blocks(other)) if kind == "file")
    on_disk = {str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)}
    assert on_disk and on_disk <= shown, f"example files no guide shows in full: {sorted(on_disk - shown)}"


# ================================================================================================ the example env


@pytest.fixture
def cart(registry: None) -> Iterator[ModuleType]:
    """docs/examples/cart_env.py imported as a module (its registration is undone by ``registry``)."""
    with imported(EXAMPLES / "cart_env.py", "cart_env_under_test") as module:
        yield module


def test_cart_rests_on_its_mark_or_falls_off_the_rail(cart: ModuleType) -> None:
    env = cart.CartEnv(cart.CartConfig(), num_envs=3)
    obs, _ = env.reset(seed=0)
    assert obs.images["camera"].shape == (3, 16, 64, 3) and obs.images["camera"].dtype == np.uint8
    env.x[:] = env.mark[0] = 0.0
    env.v[:] = [0.0, 0.0, 40.0]  # env 2 races off the right end
    env.mark[1] = 0.5  # env 1 is far from its mark
    obs, reward, terminated, truncated, info = env.step(np.zeros((3, 1), np.float32))
    np.testing.assert_array_equal(info["success"], [True, False, False])
    np.testing.assert_array_equal(terminated, [True, False, True])
    assert not truncated.any() and reward.dtype == np.float32
    np.testing.assert_allclose(reward, [1.0, -0.5, -1.0], atol=1e-6)
    np.testing.assert_allclose(obs.states["cart"][1], [0.0, 0.0, 0.5])
    env.close()


def test_cart_partial_reset_keeps_other_rows_and_camera_can_be_left_out(cart: ModuleType) -> None:
    env = cart.CartEnv(cart.CartConfig(), num_envs=3)
    env.reset(seed=3)
    before, *_ = env.step(np.ones((3, 1), np.float32))
    after, _ = env.reset(options={"reset_mask": np.array([False, True, False]), "reset_indices": np.array([1])})
    for i in (0, 2):
        np.testing.assert_array_equal(after.states["cart"][i], before.states["cart"][i])
        np.testing.assert_array_equal(after.images["camera"][i], before.images["camera"][i])
    assert after.states["cart"][1, 1] == 0.0 and before.states["cart"][1, 1] != 0.0  # at rest again
    blind = cart.CartEnv(cart.CartConfig(camera=False), num_envs=2)
    assert blind.reset(seed=0)[0].images == {}
    assert set(blind.single_observation_space["images"].spaces) == set()


def test_the_template_is_point_v1_under_its_own_id(registry: None) -> None:
    """The file the quick start copies behaves as the built-in Point-v1: same config, spaces, registration, and the
    same observations, rewards and episode ends for the same seed and actions."""
    with imported(EXAMPLES / "template_env.py", "template_env_under_test"):
        template = make_env("Template-v1", num_envs=3)
    point = make_env("Point-v1", num_envs=3)
    assert dataclasses.asdict(template.config) == dataclasses.asdict(point.config)
    assert template.single_action_space == point.single_action_space
    assert template.single_observation_space == point.single_observation_space
    mine, builtin = get_spec("Template-v1"), get_spec("Point-v1")
    assert (mine.max_episode_steps, mine.best_reward_threshold_for_success) == \
        (builtin.max_episode_steps, builtin.best_reward_threshold_for_success)

    def same_obs(a: Observation, b: Observation) -> None:
        np.testing.assert_array_equal(a.text, b.text)
        assert a.states.keys() == b.states.keys() and not a.images and not b.images
        for key in b.states:
            np.testing.assert_array_equal(a.states[key], b.states[key])

    same_obs(template.reset(seed=5)[0], point.reset(seed=5)[0])
    rng = np.random.default_rng(0)
    for _ in range(40):
        actions = rng.uniform(-1.0, 1.0, (3, 2)).astype(np.float32)
        got, want = template.step(actions), point.step(actions)
        same_obs(got[0], want[0])
        for a, b in zip(got[1:4], want[1:4]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got[4]["distance"], want[4]["distance"])
    template.close()
    point.close()


# ================================================================================================ the command helper

SAMPLE = '''\
# Sample

```bash
# a comment line
plugrl-run-env-client point-v1 --num-episodes 1 \\
    --local-policy random   # exits 2 when it fails
cd sub && export GREETING="a # b"
```

```bash
plugrl-run-policy-server --policy.action-dim 2
python my_env.py my-v1 --server-url ws://127.0.0.1:8000 | tail -1; echo "done" 2>&1 >/dev/null
python -c "print(1)"
```

```text output
not attached: the block before has three commands
```

```bash
plugrl-check-env point-v1 --no-rollout
```

```text output
shown
```
'''


def test_doc_commands_reads_commands_lines_exit_codes_and_outputs(tmp_path: Path) -> None:
    md = tmp_path / "sample.md"
    md.write_text(SAMPLE)
    blocks = bash_blocks(md)
    assert [b.line for b in blocks] == [3, 10, 20]
    found = [(c.line, c.text, c.expected_exit, c.output) for b in blocks for c in b.commands]
    assert found == [
        (5, "plugrl-run-env-client point-v1 --num-episodes 1 --local-policy random   # exits 2 when it fails", 2, None),
        (7, 'cd sub && export GREETING="a # b"', 0, None),
        (11, "plugrl-run-policy-server --policy.action-dim 2", 0, None),
        (12, 'python my_env.py my-v1 --server-url ws://127.0.0.1:8000 | tail -1; echo "done" 2>&1 >/dev/null', 0,
         None),
        (13, 'python -c "print(1)"', 0, None),
        (21, "plugrl-check-env point-v1 --no-rollout", 0, "shown\n"),
    ]
    shell = DocShell(tmp_path / "work", tmp_path / "runs", port=4321, replace={"my_env.py": "envs/my_env.py"})
    prepared = [shell.prepare(c) for b in blocks for c in b.commands]
    assert [p.kind for p in prepared] == ["client", "state", "server", "other", "other", "other"]
    runs = str(tmp_path / "runs")
    assert prepared[0].script == ("plugrl-run-env-client point-v1 --num-episodes 1 --local-policy random "
                                  f"--output-dir {runs} --no-progress   # exits 2 when it fails")
    assert prepared[2].script == "plugrl-run-policy-server --policy.action-dim 2 --port 4321"
    assert prepared[2].port == 4321
    assert prepared[3].script == (f"python envs/my_env.py my-v1 --server-url ws://127.0.0.1:4321 --output-dir {runs} "
                                  '--no-progress | tail -1; echo "done" 2>&1 >/dev/null')


@pytest.mark.slow
def test_doc_shell_carries_cd_and_export_and_ends_what_it_starts(tmp_path: Path) -> None:
    md = tmp_path / "sample.md"
    md.write_text("```bash\nmkdir sub\ncd sub && export GREETING=hello\npwd && echo $GREETING\n"
                  "exit 3   # exits 3\nsleep 30\n```\n")
    (block,) = bash_blocks(md)
    with DocShell(tmp_path / "work", tmp_path / "runs", timeout_s=1.0) as shell:
        results = shell.run_block(block)
    assert [r.returncode for r in results] == [0, 0, 0, 3, None]
    assert results[2].stdout.split() == [str(tmp_path / "work" / "sub"), "hello"]
    assert [r.ok for r in results] == [True, True, True, True, False]
    assert "killed after 1 s" in results[4].describe()


def test_doc_shell_gives_pip_installs_a_target_on_the_command_line(tmp_path: Path) -> None:
    md = tmp_path / "sample.md"
    md.write_text("```bash\npip install -e docs/examples\npython -m pip install cart-env && echo ok\n"
                  "pip --version\n```\n")
    site = tmp_path / "site dir"
    shell = DocShell(tmp_path / "work", tmp_path / "runs", pip_target=site)
    (block,) = bash_blocks(md)
    scripts = [shell.prepare(c).script for c in block.commands]
    assert scripts == [f"pip install -e docs/examples --target '{site}' --no-deps",
                       f"python -m pip install cart-env --target '{site}' --no-deps && echo ok", "pip --version"]
    assert shell.prepare(block.commands[0]).kind == "pip"
    plain = DocShell(tmp_path / "work", tmp_path / "runs")
    assert plain.prepare(block.commands[0]).script == "pip install -e docs/examples"


IGNORING_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")
"""Starts a command with SIGINT ignored, as a shell without job control starts ``nohup pytest &``."""

SHOW_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"


def test_children_start_with_sigint_at_its_default_even_when_their_parent_ignores_it() -> None:
    def ignored_in(argv: list[str]) -> bool:
        res = subprocess.run([sys.executable, "-c", IGNORING_SIGINT, *argv], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip() == "True"

    assert ignored_in([sys.executable, "-c", SHOW_SIGINT]), "a plain child inherits the ignored SIGINT"
    assert not ignored_in(sigint_default([sys.executable, "-c", SHOW_SIGINT]))


SHELL_RUN = '''\
import json, sys
from pathlib import Path
from doc_commands import DocShell, bash_blocks

(block,) = bash_blocks(Path(sys.argv[1]))
with DocShell(Path(sys.argv[2]), Path(sys.argv[2]) / "runs") as shell:
    print(json.dumps([[r.returncode, r.note] for r in shell.run_block(block)]))
'''


@pytest.mark.slow
def test_doc_shell_stops_its_server_with_ctrl_c_when_the_tests_ignore_it(tmp_path: Path) -> None:
    """Under ``nohup pytest &`` the tests' process ignores SIGINT; the server a doc starts still ends on it."""
    md = tmp_path / "sample.md"
    md.write_text("```bash\nplugrl-run-policy-server --policy.action-dim 2\n```\n")
    support = str(Path(__file__).resolve().parents[1] / "_support")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (support, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", IGNORING_SIGINT, sys.executable, "-c", SHELL_RUN, str(md),
                          str(tmp_path / "work")], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [[0, "started in the background"], [0, ""]]
