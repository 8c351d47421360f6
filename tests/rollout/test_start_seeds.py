"""Fixed start states (``--runner.start-seeds``): the run's k-th episode starts from the k-th listed seed, one
episode per seed, whatever the number of processes or pipeline groups."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.rollout.seeds import GroupSeeds, SeedGroups, listed_share

discover_envs()
from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402


def test_listed_shares_split_like_the_static_episode_split() -> None:
    seeds = (10, 11, 12, 13, 14, 15, 16)
    shares = [listed_share(seeds, p, 3) for p in range(3)]
    assert shares == [(10, 11, 12), (13, 14), (15, 16)]
    assert listed_share((1,), 1, 2) == ()


def test_each_env_runs_every_stride_th_listed_seed_and_then_has_none_left() -> None:
    """Envs 2..3 of a process of 4 envs (a second pipeline group) with 7 listed seeds: env 2 runs seeds[2] and
    seeds[6], env 3 runs seeds[3] and then has none left."""
    listed = (100, 101, 102, 103, 104, 105, 106)
    seeds = GroupSeeds(0, 0, offset=2, n=2, group_size=1, per_env=True, listed=listed, stride=4)
    assert seeds.initial() == [102, 103]
    assert not seeds.exhausted().any()
    groups = SeedGroups(seeds)
    rows, argument, _ = groups.restart(np.array([0, 1]))
    assert argument == [106, None]
    assert seeds.exhausted().tolist() == [False, True]
    assert seeds.recorded(argument, rows) == [106, None]


def test_listed_seeds_refuse_seed_groups_and_negative_seeds() -> None:
    with pytest.raises(ConfigError, match="cannot be combined with seed groups"):
        GroupSeeds(0, 0, 0, 4, 2, listed=(1, 2, 3, 4))
    with pytest.raises(ConfigError, match="start seeds must be >= 0, got -1"):
        GroupSeeds(0, 0, 0, 2, 1, per_env=True, listed=(3, -1))


def _starts(run: Path) -> dict[int, float]:
    """Start seed -> return of every episode of a run."""
    out: dict[int, float] = {}
    for path in run.glob("rollout/proc_*/episodes.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert record["seed"] not in out, f"seed {record['seed']} ran twice"
            out[record["seed"]] = record["return"]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("procs, pipeline", [(2, 1), (1, 2)])
def test_episode_k_starts_from_seed_k_whatever_the_processes(tmp_path: Path, procs: int, pipeline: int) -> None:
    """Point-v1 under the zero policy: a return depends only on the start state, so the same seeds give the same
    returns run with one process of 3 envs, with 2 processes, or with 2 pipeline groups."""
    seeds = (5, 900, 17, 42, 3, 77, 1234)
    base = ClientConfig(num_envs=4 if pipeline > 1 else 3, local_policy="zero", output_dir=tmp_path, progress=False,
                        runner=RunnerConfig(start_seeds=seeds), env=PointEnvConfig())
    assert run_client(dataclasses.replace(base, exp_name="one", num_envs=3), "Point-v1") == 0
    other = dataclasses.replace(base, exp_name="other", num_procs=procs,
                                runner=dataclasses.replace(base.runner, pipeline=pipeline))
    assert run_client(other, "Point-v1") == 0
    one, two = _starts(tmp_path / "one"), _starts(tmp_path / "other")
    assert sorted(one) == sorted(seeds)
    assert one == pytest.approx(two)
    assert len(set(one.values())) > 1, "different start states give different returns"
