"""Where a Ray run's processes ran: ``ray_nodes.json`` in the run folder, rewritten every ``NODES_PERIOD_S`` and at
the end (per node: its processes and their env steps, episodes and env-steps/s; per process: its node(s) and
restarts), and a log line per node at the end."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from plugrl_env_client.outputs.run_dir import write_json_atomic
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)

NODES_PERIOD_S = 10.0
NODES_FILE = "ray_nodes.json"


@dataclasses.dataclass
class Epoch:
    """One run of one actor: where it ran (``node``: what the actor said when it started) and what it did there."""

    node: dict[str, Any] | None = None
    timing: Timing = dataclasses.field(default_factory=Timing)
    episodes: int = 0


def node_table(histories: Mapping[int, Sequence[Epoch]]) -> dict[str, Any]:
    """Per node, the processes that ran there and their env steps, episodes and env-steps/s (summed over the
    processes on it); per process, its node(s) and restarts. ``histories``: each process's epochs, in order."""
    nodes: dict[str, dict[str, Any]] = {}
    processes: dict[str, Any] = {}
    per_node_time: dict[tuple[str, int], list[float]] = {}
    for pid, history in histories.items():
        placed = [e.node for e in history if e.node is not None]
        processes[str(pid)] = {
            "node_id": placed[-1]["node_id"] if placed else None,
            "ip": placed[-1]["ip"] if placed else None,
            "restarts": max(len(history) - 1, 0),
            "nodes": [node["node_id"] for node in placed],
        }
        for e in history:
            if e.node is None:
                continue
            entry = nodes.setdefault(e.node["node_id"], {
                "ip": e.node["ip"], "hostname": e.node["hostname"], "processes": [], "env_steps": 0,
                "completed_episodes": 0, "env_steps_per_s": 0.0})
            if pid not in entry["processes"]:
                entry["processes"].append(pid)
            entry["env_steps"] += e.timing.env_steps
            entry["completed_episodes"] += e.episodes
            spent = per_node_time.setdefault((e.node["node_id"], pid), [0.0, 0.0])
            spent[0] += e.timing.env_steps
            spent[1] += e.timing.collect_time_s
    for (node_id, _pid), (steps, seconds) in per_node_time.items():
        if seconds > 0:
            nodes[node_id]["env_steps_per_s"] = round(nodes[node_id]["env_steps_per_s"] + steps / seconds, 3)
    return {"nodes": nodes, "processes": processes}


def write_nodes(run_root: Path, histories: Mapping[int, Sequence[Epoch]], final: bool = False) -> None:
    """``ray_nodes.json`` from ``histories`` (a failed write is a warning: the run's results do not depend on it);
    at the end (``final``) also one log line per node."""
    table = node_table(histories)
    try:
        write_json_atomic(run_root / NODES_FILE, table)
    except OSError as exc:
        logger.warning("could not write %s: %s", NODES_FILE, exc)
    if final:
        for node_id, entry in table["nodes"].items():
            logger.info("node %s (%s, %s): processes %s, %d env steps, %d episodes, %.0f env-steps/s", entry["ip"],
                        entry["hostname"], node_id[:12], entry["processes"], entry["env_steps"],
                        entry["completed_episodes"], entry["env_steps_per_s"])
