"""Run in a child with LIBERO on its path (tests/envs/test_libero_env.py): LIBERO-v1's copies of libero_spatial's
task 0, checked against the benchmark's own initial-state file and robosuite's own observations; prints one JSON
object of findings on stdout.

Two copies reset with seeds 47 and 103 (no settle steps) must hold the file's rows 47 and 3 as their MuJoCo
states; a copy reset alone must leave the other's row as it was; the process's own numpy generator must come out
untouched. Then, without cameras, a copy of an env of one, reset with seed 103, must be in the MuJoCo state (model
included) of copy 1 of an env of two, step for step, while copy 0 gets other actions: no copy's randomness depends
on another's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from libero.libero import benchmark, get_libero_path

from plugrl_env_client.envs.libero.libero_env import CAMERAS, STATES, LiberoEnv, LiberoEnvConfig

SIZE = 32


def main() -> None:
    suite = benchmark.get_benchmark_dict()["libero_spatial"]()
    task = suite.get_task(0)
    with np.load(Path(get_libero_path("init_states")) / task.problem_folder / f"{task.init_states_file}.npz") as f:
        file_states = f["states"]
    config = LiberoEnvConfig(suite="libero_spatial", task_id=0, camera_size=SIZE, settle_steps=0)
    out: dict = {"file_rows": len(file_states), "instruction": task.language}

    np.random.seed(5)
    untouched = np.random.random()
    np.random.seed(5)
    pair = LiberoEnv(config, num_envs=2)
    obs, info = pair.reset(seed=[47, 103])
    out["process_rng_kept"] = bool(np.random.random() == untouched)
    out["init_state"] = info["init_state"].tolist()
    out["sim_is_file_row"] = [bool(np.array_equal(env.get_sim_state(), file_states[row]))
                              for env, row in zip(pair.copies, (47, 103 % len(file_states)))]
    raw = pair.copies[0].env._get_observations(force_update=True)
    out["images"] = {k: [list(v.shape), str(v.dtype)] for k, v in obs.images.items()}
    out["upright"] = {k: bool(np.array_equal(obs.images[k][0], raw[source][::-1, ::-1])) for k, source in CAMERAS.items()}
    out["states"] = {k: [list(v.shape), str(v.dtype)] for k, v in obs.states.items()}
    out["state_is_the_concatenation"] = bool(np.array_equal(
        obs.states["state"], np.concatenate([obs.states[k] for k in STATES], axis=1)))
    out["eef_pos_is_robosuite's"] = bool(np.allclose(obs.states["robot0_eef_pos"][0], raw["robot0_eef_pos"]))
    out["text"] = obs.text.tolist()
    first = obs.copy()

    again, info = pair.reset(seed=[None, 9], options={"reset_indices": [1]})
    out["partial_init_state"] = info["init_state"].tolist()
    out["other_row_kept"] = all(np.array_equal(again.images[k][0], first.images[k][0]) for k in CAMERAS) and all(
        np.array_equal(again.states[k][0], first.states[k][0]) for k in again.states)
    out["reset_row_changed"] = not np.array_equal(again.states["state"][1], first.states["state"][1]) or not all(
        np.array_equal(again.images[k][1], first.images[k][1]) for k in CAMERAS)

    pair.close()

    # Without cameras (a reset with them costs seconds): the MuJoCo states themselves are compared.
    blind = dataclasses.replace(config, render=False)
    pair = LiberoEnv(blind, num_envs=2)
    single = LiberoEnv(blind, num_envs=1)
    pair.reset(seed=[47, 103])
    single.reset(seed=[103])
    same = [_same_sim(pair, 1, single, 0)]
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 7)).astype(np.float32)
    for action in actions:
        pair.step(np.stack([-action, action]))
        one, rewards, terminated, truncated, step_info = single.step(action[None])
        same.append(_same_sim(pair, 1, single, 0))
    out["copy_alone_sees_the_same"] = same
    out["blind_observation"] = {"images": sorted(one.images), "states": sorted(one.states)}
    out["step"] = {"rewards": rewards.tolist(), "terminated": terminated.tolist(), "truncated": truncated.tolist(),
                   "success": step_info["success"].tolist()}
    pair.close()
    single.close()
    print(json.dumps(out))


def _same_sim(a: LiberoEnv, i: int, b: LiberoEnv, j: int) -> bool:
    """Copy ``i`` of ``a`` and copy ``j`` of ``b`` are in the same MuJoCo state, model included (robosuite places
    the fixed objects in the model it builds on each reset, from numpy's global generator)."""
    left, right = a.copies[i], b.copies[j]
    return bool(np.array_equal(left.get_sim_state(), right.get_sim_state())
                and np.array_equal(left.sim.model.body_pos, right.sim.model.body_pos))


if __name__ == "__main__":
    main()
