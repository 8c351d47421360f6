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
from extras import need

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.report.build import build_report

mpimg = need("matplotlib.image")


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
def test_sampled_images_are_shown_shrunk_enlarged_or_as_they_are(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10)})
    sampled = root / "rollout/proc_000/sampled"
    sampled.mkdir()
    mpimg.imsave(sampled / "ep000001_first_base.png", np.random.default_rng(0).random((400, 300, 3)))
    tiny = np.random.default_rng(1).integers(0, 256, (12, 20, 3)).astype(np.uint8)
    mpimg.imsave(sampled / "ep000001_last_tiny.png", tiny)
    mpimg.imsave(sampled / "ep000002_last_mid.png", np.zeros((100, 120)), cmap="gray")
    report = build_report(root)
    shown = {p.name.split("__")[-1]: p for p in report.thumbnails}
    assert set(shown) == {"ep000001_first_base.png", "ep000001_last_tiny.png"}
    thumb = mpimg.imread(shown["ep000001_first_base.png"])
    assert max(thumb.shape[:2]) <= 160 and thumb.shape[0] > thumb.shape[1], "the aspect ratio is kept"
    big = np.round(mpimg.imread(shown["ep000001_last_tiny.png"])[..., :3] * 255).astype(np.uint8)
    assert big.shape == (12 * 8, 20 * 8, 3), "enlarged 8 times: the largest whole factor within 160 px"
    assert np.array_equal(big, np.repeat(np.repeat(tiny, 8, axis=0), 8, axis=1)), "each pixel a sharp 8x8 block"
    parser = sources(report.page)
    for name, copy in shown.items():
        assert "report/thumbs/" + copy.name in parser.src
        assert f"rollout/proc_000/sampled/{name}" in parser.href, "the copy links the original"
    assert "rollout/proc_000/sampled/ep000002_last_mid.png" in parser.src, "about the shown size: as it is"
    assert "episode 1, first, base" in report.page.read_text()


def test_recorder_drops_are_noted_from_the_summaries_or_the_manifests(tmp_path):
    root = write_run(tmp_path / "run", {0: episode_lines(0, 10), 1: episode_lines(1, 10), 2: episode_lines(2, 5)})
    assert "recorder dropped" not in build_report(root).page.read_text(), "no drops, no note"
    proc0 = root / "rollout/proc_000/summary.json"
    summary = json.loads(proc0.read_text())
    summary["recorder"] = {"episodes_recorded": 5, "episodes_dropped": 3, "frames_dropped": 120}
    proc0.write_text(json.dumps(summary))
    (root / "rollout/proc_001/manifest.json").write_text(json.dumps(  # a run whose summaries predate the counts
        {"recorder": {"files": [], "episodes_recorded": 1, "episodes_dropped": 1, "frames_dropped": 7}}))
    (root / "rollout/proc_002/manifest.json").write_text(json.dumps({"recorder": {"episodes_dropped": 0}}))
    text = build_report(root).page.read_text()
    assert ("<li>the recorder dropped 4 recorded episodes (127 observations) because its writer was behind (3 in "
            "process 0, 1 in process 1): they have no sampled observations or videos. Record fewer episodes with a "
            "larger --recorder.episode-freq</li>") in text


def test_a_run_without_episodes_says_whether_to_wait_or_what_happened(tmp_path):
    root = write_run(tmp_path / "run", {0: [], 1: []})
    total = root / "summary.json"

    def page_for(status: str, errors: dict[str, str]) -> str:
        total.write_text(json.dumps({**json.loads(total.read_text()), "status": status, "errors": errors}))
        return build_report(root).page.read_text()

    assert "Run the report again once episodes are written" in page_for("running", {})
    text = page_for("interrupted", {})
    assert "The run was interrupted before any episode finished, so there is nothing to plot." in text
    assert "It left no log at logs/client.log." in text and "Run the report again" not in text
    text = page_for("failed", {str(pid): f"error {pid} &lt;b&gt;" for pid in range(5)})
    assert ("Its errors (summary.json): process 0: error 0 &amp;lt;b&amp;gt;; process 1: error 1 &amp;lt;b&amp;gt;; "
            "process 2: error 2 &amp;lt;b&amp;gt;; and 2 more.") in text
    assert "The run ended (stopped by server) before any episode finished" in page_for("stopped by server", {})
    total.unlink()  # the processes' own summaries decide then
    assert "The run ended (finished) before any episode finished" in build_report(root).page.read_text()


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


def _record_a_run(root: Path, exp: str) -> Path:
    """A real client run of Dummy-v1 that records every episode; its process folder."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig
    from plugrl_env_client.envs.dummy.dummy_env import DummyEnvConfig
    from plugrl_env_client.outputs.recording.config import RecorderConfig

    config = ClientConfig(num_envs=2, num_episodes=2, local_policy="random", output_dir=root, exp_name=exp,
                          progress=False, env=DummyEnvConfig(base_image_size=32, wrist_image_size=16),
                          recorder=RecorderConfig(episode_freq=1))
    assert run_client(config, "Dummy-v1") == 0
    return root / exp / "rollout" / "proc_000"


def test_the_report_shows_the_samples_of_a_run_in_plugrls_layout_and_of_one_in_the_older_flat_layout(tmp_path):
    """Both layouts from real runs: the second run's samples are moved to the flat names older clients wrote
    (``ep<start>_env<env>_<moment>_<key>.<ext>`` directly under ``sampled/``)."""
    new = _record_a_run(tmp_path, "new")
    old = _record_a_run(tmp_path, "old")
    for path in sorted((old / "sampled").glob("ep_*/env_*/obs/*/*/*.*")):
        episode, env, moment = path.parts[-6], path.parts[-5], path.parts[-3]
        start = int(episode.removeprefix("ep_")) - 1
        flat = old / "sampled" / f"ep{start:06d}_env{env.removeprefix('env_')}_{moment}_{path.name}"
        path.rename(flat)
    for folder in sorted((old / "sampled").glob("ep_*"), reverse=True):
        for leftover in sorted(folder.rglob("*"), reverse=True):
            leftover.unlink() if leftover.is_file() else leftover.rmdir()
        folder.rmdir()
    for run, expected in ((new, "/obs/first/images/base.png"), (old, "_first_base.png")):
        page = build_report(run.parent.parent).page
        assert_clean(page)
        html = page.read_text()
        shown = re.findall(r'(?:src|href)="([^"]+\.png)"', html)  # small frames are shown enlarged, linking the file
        assert any(expected in src for src in shown), (expected, shown)
        assert "episode 1, env" in html if run is new else "episode 0, env" in html
