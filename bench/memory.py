"""Peak client memory on the observation path: Dummy-v1 at n=256 (48 MB per observation batch).

Run from the repo root (Linux: it reads /proc)::

    python bench/memory.py            # about 40 s
    python bench/memory.py --quick    # about 20 s

The reference server runs in a subprocess (so its memory is not counted). This process builds the env, resets it,
and takes its resident memory then as the baseline; it resets the kernel's peak counter (``/proc/self/clear_refs``)
and runs the real process code (``launch.process.run_process``) for a number of batch steps with the server's
random policy, H=8, for each server transport (the client is the same one-thread client in both rows). The figure
is the peak resident memory above the baseline, in units of one observation batch (every image and state of the
256 envs). Target: at most 3 frames.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_line
from pipeline import free_port

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.dummy.dummy_env import DummyEnvConfig
from plugrl_env_client.launch.process import ProcessJob, run_process
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.utils.registration import make_env

NUM_ENVS = 256
HORIZON = 8
TARGET_FRAMES = 3.0


def status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS


def measure(transport: str, steps: int) -> tuple[float, float, int]:
    """(peak above baseline in bytes, frame bytes, env steps) for one client run of about ``steps`` batch steps."""
    import subprocess

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(port),
         "--policy.action-dim", "7", "--policy.action-horizon", str(HORIZON), "--transport", transport],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None and "listening" in server.stdout.readline()
        env_config = DummyEnvConfig(terminated_prob=0.01)
        env = make_env("Dummy-v1", num_envs=NUM_ENVS, config=env_config)
        obs, _ = env.reset(seed=0)
        frame = sum(a.nbytes for a in obs.images.values()) + sum(a.nbytes for a in obs.states.values())
        del obs  # the run holds its own
        config = ClientConfig(num_envs=NUM_ENVS, server_port=port, progress=False, env=env_config,
                              transport=transport,  # type: ignore[arg-type]
                              runner=RunnerConfig(seed=0))
        budget = EpisodeBudget(None)
        with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
            writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
            baseline = status("VmRSS")
            reset_peak()

            def stop_after_steps() -> None:
                while not budget.stop.is_set():
                    if budget.env_steps >= steps * NUM_ENVS:
                        budget.stop.set()
                    time.sleep(0.05)

            watcher = threading.Thread(target=stop_after_steps, daemon=True)
            watcher.start()
            run_process(ProcessJob("Dummy-v1", config, 0, f"ws://127.0.0.1:{port}"), budget, writer, env=env)
            budget.stop.set()
            watcher.join()
            peak = status("VmHWM")
            writer.close()
        return peak - baseline, frame, budget.env_steps
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    args = parser.parse_args()
    steps = 24 if args.quick else 64
    discover_envs()
    print(f"{machine_line('msgpack', 'websockets', 'picows')}; Dummy-v1 "
          f"n={NUM_ENVS} H={HORIZON}, about {steps} batch steps per transport")
    for transport in ("websockets", "picows"):
        try:
            above, frame, env_steps = measure(transport, steps)
        except ImportError as exc:
            print(f"  {transport:<10} skipped ({exc})")
            continue
        ratio = above / frame
        verdict = "met" if ratio <= TARGET_FRAMES else "NOT MET"
        print(f"  {transport:<10} peak {above / 1e6:7.1f} MB above baseline = {ratio:4.2f} frames of "
              f"{frame / 1e6:.1f} MB (target <= {TARGET_FRAMES:g}: {verdict}), {env_steps} env steps")


if __name__ == "__main__":
    main()
