"""Instructions the client executes per batch step, counted by valgrind: a figure the machine's load does not move.

Run from the repo root (needs ``valgrind`` on the PATH)::

    python bench/instructions.py                         # this tree: about 3 minutes
    python bench/instructions.py --against ../other-tree # and another checkout's tree, with the ratio

Timings on a shared machine swing by 1.5x within minutes, more than most changes to the client's hot path move
them. Instructions do not: a whole client run (Point-v1 x16, H=8, lockstep, random actions from the reference
server, seeds fixed) runs under valgrind's callgrind, which counts every instruction of the process; the server
runs in a process of its own, not counted, started afresh for each run. Two runs of different length (``--episodes`` N1 and N2) take start-up
and shutdown out: the figure is (instructions of the long run - those of the short one) / (batch steps of the long
run - those of the short one), the client's work per batch step with Point-v1's own step, which is small, included.

What it does not see: time spent waiting, and the cost of cold caches after a heavy simulator step (a big code
path pays more there than its instruction count says). Use it to compare two trees, next to ``pipeline.py``'s
timings, not in place of them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import ReferenceServer, machine_line

ROOT = Path(__file__).resolve().parent.parent
ENV, NUM_ENVS, ACTION_DIM, HORIZON = "Point-v1", 16, 2, 8
SERVER_FLAGS = ["--policy.action-dim", str(ACTION_DIM), "--policy.action-horizon", str(HORIZON)]
RUN = ("import sys\nfrom plugrl_env_client.cli import main\n"
       "sys.argv = ['plugrl-run-env-client', *sys.argv[1:]]\nsys.exit(main())")


def counted_run(tree: Path, episodes: int) -> tuple[int, int]:
    """(instructions, batch steps) of one client run of ``episodes`` episodes, the package imported from
    ``tree``/src, against a server of its own (the server seeds a stream's actions by how often it connected, so
    every run gets a fresh one: the same actions, the same episodes)."""
    with tempfile.TemporaryDirectory(prefix="plugrl-instructions-") as tmp, ReferenceServer(SERVER_FLAGS) as server:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", RUN, ENV,
               "--num-envs", str(NUM_ENVS), "--num-episodes", str(episodes), "--server-port", str(server.port),
               "--no-progress", "--output-dir", tmp, "--exp-name", "run"]
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
        counted = re.search(r"Collected : (\d+)", done.stderr)
        summary = Path(tmp) / "run" / "summary.json"
        if done.returncode != 0 or counted is None or not summary.exists():
            raise RuntimeError(f"the counted run of {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
        return int(counted.group(1)), int(json.loads(summary.read_text())["timing"]["batch_steps"])


def per_batch_step(tree: Path, short: int, long: int) -> float:
    """Instructions per batch step of ``tree``'s client: the long run's excess over the short one's."""
    ir_short, steps_short = counted_run(tree, short)
    ir_long, steps_long = counted_run(tree, long)
    if steps_long <= steps_short:
        raise RuntimeError(f"the long run took {steps_long} batch steps, the short one {steps_short}")
    return (ir_long - ir_short) / (steps_long - steps_short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout of the repo, counted the same way")
    parser.add_argument("--episodes", type=int, nargs=2, default=(64, 320), metavar=("N1", "N2"),
                        help="episodes of the short and the long run (default: 64 320)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind on the PATH (e.g. apt install valgrind)")
    print(machine_line())
    print(f"{ENV} x{NUM_ENVS}, H={HORIZON}, lockstep; instructions of the client process per batch step (valgrind "
          f"callgrind), runs of {args.episodes[0]} and {args.episodes[1]} episodes")
    trees = [("this tree", ROOT)] + ([("--against", args.against.resolve())] if args.against else [])
    figures = {}
    for name, tree in trees:
        figures[name] = per_batch_step(tree, *args.episodes)
        print(f"  {name:<10} {figures[name]:>12,.0f} instructions per batch step  ({tree})")
    if args.against:
        print(f"  this tree / --against: {figures['this tree'] / figures['--against']:.3f}")


if __name__ == "__main__":
    main()
