"""``build_report`` on run folders written by hand: every line form a run can leave, and what the page makes of it."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.report.build import build_report

mpimg = pytest.importorskip("matplotlib.image")


def episode_lines(pid: int, n: int, num_envs: int = 4, rate: float = 1000.0, new: bool = True,
                  metrics: bool = False, success: bool | None = True, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` episodes of one process: lengths 5..40, env steps counted at ``rate`` per second."""
    rng = np.random.default_rng(seed + pid)
    rows, steps = [], 0
    for i in range(n):
        length = int(rng.integers(5, 41))
        steps += length
        row: dict[str, Any] = {"env_index": i % num_envs, "return": float(rng.normal(i * 0.1, 1.0)), "length": length,
                               "success": None if success is None else bool(rng.random() < 0.2 + i / (2 * n)),
                               "terminated": length < 40, "truncated": length == 40}
        if new:
            row.update(process_id=pid, seed=None, wall_time_s=round(steps / rate, 6), env_steps=steps)
        if metrics:
            row["metrics"] = {"distance": float(rng.random()), "energy/used": float(i)}
            row["instruction"] = f"reach goal {i % 3}"
        rows.append(row)
    return rows


def write_run(root: Path, episodes: dict[int, list[dict[str, Any]]], summaries: bool = True,
              config: bool = True, timing_form: str = "new") -> Path:
    """A run folder as the client leaves it: config, per-process episodes and summaries, the aggregate."""
    root.mkdir(parents=True)
    if config:
        (root / "client_config.json").write_text(json.dumps({"env_id": "Fake-v1", "num_envs": 4,
                                                              "num_procs": len(episodes)}))
    for pid, rows in episodes.items():
        folder = root / "rollout" / f"proc_{pid:03d}"
        folder.mkdir(parents=True)
        (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if summaries:
            steps = rows[-1].get("env_steps", sum(r["length"] for r in rows)) if rows else 0
            collect = steps / 1000.0 + 0.01
            timing = ({"env_steps": steps, "env_step_s": collect * 0.3, "reset_s": collect * 0.05,
                       "infer_obs_pack_s": collect * 0.1, "infer_wait_s": collect * 0.4, "feedback_s": collect * 0.05,
                       "pack_s": collect * 0.08, "collect_time_s": collect, "effective_fps": steps / collect}
                      if timing_form == "new" else
                      {"env_steps": steps, "env_step_s": collect * 0.3, "reset_s": collect * 0.05,
                       "pack_s": collect * 0.1, "infer_wait_s": collect * 0.4, "collect_time_s": collect,
                       "effective_fps": steps / collect})
            judged = [r["success"] for r in rows if r.get("success") is not None]
            summary = {"process_id": pid, "status": "finished", "completed_episodes": len(rows),
                       "all_episodes": {"mean_return": float(np.mean([r["return"] for r in rows])) if rows else None,
                                        "mean_success_rate": float(np.mean(judged)) if judged else None},
                       "timing": timing}
            (folder / "summary.json").write_text(json.dumps(summary))
    if summaries:
        every = [r for rows in episodes.values() for r in rows]
        judged = [r["success"] for r in every if r.get("success") is not None]
        (root / "summary.json").write_text(json.dumps({
            "status": "finished", "completed_episodes": len(every), "timing": {"effective_fps": 1234.5},
            "all_episodes": {"mean_return": float(np.mean([r["return"] for r in every])) if every else None,
                             "mean_success_rate": float(np.mean(judged)) if judged else None}}))
    return root


class Sources(HTMLParser):
    """Every src and href on a page."""

    def __init__(self) -> None:
        super().__init__()
        self.src: list[str] = []
        self.href: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "src" and value:
                self.src.append(value)
            if name == "href" and value:
                self.href.append(value)


def sources(page: Path) -> Sources:
    parser = Sources()
    parser.feed(page.read_text())
    return parser


def figure_names(root: Path) -> set[str]:
    return {p.name for p in (root / "report").glob("*.png")}


def assert_clean(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"\b(nan|NaN|inf|Infinity)\b", text), "the page shows a non-finite number"
    parser = sources(page)
    for src in parser.src:
        assert (page.parent / src).exists(), f"{src} is referenced but missing"


@pytest.mark.slow
def test_new_format_with_metrics_and_instructions(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 50, metrics=True), 1: episode_lines(1, 40, metrics=True)})
    report = build_report(root)
    names = figure_names(root)
    for quantity in ("return", "length", "success"):
        for axis in ("env_steps", "wall_time"):
            assert f"{quantity}_{axis}.png" in names and f"{quantity}_{axis}_by_process.png" in names
    assert {"length_histogram.png", "throughput.png", "time_split.png", "metric_distance.png",
            "metric_energy_used.png"} <= names
    assert {p.name for p in report.figures} == names
    srcs = set(sources(report.page).src)
    assert {f"report/{n}" for n in names} <= srcs
    text = report.page.read_text()
    assert "reach goal 0" in text and "Instructions" in text
    assert "feedback" in text  # the time split names the stage timings of current summaries
    assert_clean(report.page)


@pytest.mark.slow
def test_page_figures_match_a_second_build_and_stale_figures_go(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 30, metrics=True)})
    build_report(root)
    assert "metric_distance.png" in figure_names(root)
    rows = episode_lines(0, 30, metrics=False)
    (root / "rollout/proc_000/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report(root)
    assert "metric_distance.png" not in figure_names(root), "a figure the data no longer supports is removed"


@pytest.mark.slow
def test_success_not_judged_leaves_out_success_and_says_n_a(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 30, success=None)})
    report = build_report(root)
    assert not any(n.startswith("success") for n in figure_names(root))
    table = report.page.read_text().split("<h2 id=\"summary\">Summary</h2>")[1].split("</table>")[0]
    assert table.count("n/a") == 2, "success rate is n/a in the process row and the total row"


@pytest.mark.slow
def test_null_returns_and_metrics_are_left_out_not_plotted_as_nan(tmp_path):
    rows = episode_lines(0, 20, metrics=True)
    rows[3]["return"] = None
    rows[4]["metrics"]["distance"] = None
    root = write_run(tmp_path / "run", {0: rows}, summaries=False)
    report = build_report(root)
    assert "return_env_steps.png" in figure_names(root)
    table = report.page.read_text().split("<h2 id=\"summary\">Summary</h2>")[1].split("</table>")[0]
    finite = [r["return"] for r in rows if r["return"] is not None]
    assert f"{np.mean(finite):.4f}" in table, "the mean return is over the finite returns"
    assert_clean(report.page)


@pytest.mark.slow
def test_old_timing_form_gives_a_time_split(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 20)}, timing_form="old")
    report = build_report(root)
    assert "time_split.png" in figure_names(root)
    assert "report/time_split.png" in sources(report.page).src


@pytest.mark.slow
def test_window_is_used_and_must_be_positive(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 20)})
    assert "moving averages over 7 episodes (--window)" in build_report(root, window=7).page.read_text()
    assert "moving averages over 5 episodes (default" in build_report(root).page.read_text()
    with pytest.raises(ConfigError, match="--window must be >= 1"):
        build_report(root, window=0)


@pytest.mark.slow
def test_text_of_the_run_is_escaped(tmp_path):
    rows = episode_lines(0, 10, metrics=True)
    for r in rows:
        r["instruction"] = "<script>alert(1)</script> & go"
    root = write_run(tmp_path / "run", {0: rows})
    text = build_report(root).page.read_text()
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; go" in text


@pytest.mark.slow
def test_a_process_folder_never_made_is_listed_without_summary(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10)})
    config = json.loads((root / "client_config.json").read_text())
    (root / "client_config.json").write_text(json.dumps({**config, "num_procs": 2}))
    text = build_report(root).page.read_text()
    assert "no summary.json for process 1" in text
    assert "<td>process 1</td><td class=\"text\">no summary</td><td>0</td>" in text


@pytest.mark.slow
def test_large_sampled_images_get_thumbnails_small_ones_are_shown_as_they_are(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10)})
    sampled = root / "rollout/proc_000/sampled"
    sampled.mkdir()
    big = np.random.default_rng(0).random((400, 300, 3))
    mpimg.imsave(sampled / "ep000001_first_base.png", big)
    mpimg.imsave(sampled / "ep000001_last_gray.png", np.zeros((32, 48)), cmap="gray")
    report = build_report(root)
    assert len(report.thumbnails) == 1
    thumb = mpimg.imread(report.thumbnails[0])
    assert max(thumb.shape[:2]) <= 160 and thumb.shape[0] > thumb.shape[1], "the aspect ratio is kept"
    parser = sources(report.page)
    assert "report/thumbs/" + report.thumbnails[0].name in parser.src
    assert "rollout/proc_000/sampled/ep000001_first_base.png" in parser.href, "the thumbnail links the original"
    assert "rollout/proc_000/sampled/ep000001_last_gray.png" in parser.src
    assert "episode 1, first, base" in report.page.read_text()


@pytest.mark.slow
def test_states_and_texts_are_described(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10)})
    sampled = root / "rollout/proc_000/sampled"
    sampled.mkdir()
    np.save(sampled / "ep000002_first_state.npy", np.array([1.5, -2.0], np.float32))
    np.save(sampled / "ep000002_last_state.npy", np.array([math.nan, 1.0]))
    (sampled / "ep000002_first_prompt.txt").write_text("Guess a number between 1 and 10")
    text = build_report(root).page.read_text()
    assert "float32 (2,) [ 1.5, -2. ]" in text
    assert "float64 (2,) (holds non-finite values)" in text
    assert "Guess a number between 1 and 10" in text
    assert_clean(root / "report.html")


def test_not_a_run_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no client_config.json and no rollout/"):
        build_report(tmp_path / "empty")
    with pytest.raises(ConfigError, match="does not exist"):
        build_report(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a run folder"):
        build_report(tmp_path / "file")


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10)})
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=re.escape('pip install "plugrl-env-client[report]"')):
        build_report(root)
    assert not (root / "report.html").exists()
