"""bench/openpi.py runs end to end: openpi's own loop against the real ``openpi-server``, this client on one and two
openpi servers and on the reference server in openpi mode (real processes on 127.0.0.1, openpi's packages in a
folder of their own, :mod:`openpi_site`). A tiny run; its figures are checked to be numbers, never against a time."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from file_modules import BENCH, bench_script
from openpi_site import install_openpi

ROW = re.compile(r"^\(([abcd])\) .*?\s+([\d.]+)\s+([\d,]+)\s+([\d.]+)\s+(server|env)\s+([\d.]+)$")


@pytest.mark.slow
def test_a_tiny_run_prints_every_row_with_finite_positive_figures(tmp_path_factory: pytest.TempPathFactory) -> None:
    site = install_openpi(tmp_path_factory.mktemp("openpi-site"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(BENCH / "openpi.py"), "--rounds", "1", "--seconds", "1",
                          "--openpi-site", str(site)], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {m[1]: [float(x.replace(",", "")) for x in (m[2], m[3], m[4], m[6])]
            for m in map(ROW.match, res.stdout.splitlines()) if m}
    assert set(rows) == set("abcd"), res.stdout
    for row, (rate, per_hour, limit, of_limit) in rows.items():
        assert all(math.isfinite(x) and x > 0 for x in (rate, per_hour, limit, of_limit)), (row, res.stdout)
        assert per_hour == pytest.approx(rate * 3600 / 50, abs=5), "an episode is 50 env steps (rates print to 0.1)"
    verdicts = [line for line in res.stdout.splitlines() if "target >=" in line]
    assert len(verdicts) == 3 and all(re.search(r": (met|NOT MET)\)", line) for line in verdicts), res.stdout
    assert "openpi-client 0.1.2" in res.stdout and "load avg" in res.stdout.splitlines()[-1]


def test_the_bench_env_steps_every_copy_at_its_cost_and_ends_episodes_at_50_steps(registry) -> None:
    with bench_script("openpi") as bench:
        env = bench.OpenpiBenchEnv(bench.OpenpiBenchConfig(step_ms=1.0), num_envs=3)
        obs, _ = env.reset(seed=0)
        assert obs.images["agentview"].shape == (3, 224, 224, 3) and obs.images["wrist"].dtype == np.uint8
        assert obs.states["state"].shape == (3, 8) and list(obs.text) == [bench.INSTRUCTION] * 3
        for t in range(1, 51):
            obs, _, done, truncated, _ = env.step(np.zeros((3, 7), np.float32))
            assert done.all() == (t == 50) and not truncated.any()
        assert bench.CLOCK.steps == 150 and bench.CLOCK.last - bench.CLOCK.first >= 49 * 3 * 1e-3
        env.close()


def test_libero_rows_without_libero_say_it_is_not_installed(registry, monkeypatch) -> None:
    with bench_script("openpi") as bench:
        monkeypatch.setattr(bench, "registered_ids", lambda: ["OpenpiBench-v1"])
        with pytest.raises(SystemExit, match="LIBERO-v1 is not installed here .*plugrl-env-client\\[libero\\]"):
            bench.libero_workload(8, 2)
