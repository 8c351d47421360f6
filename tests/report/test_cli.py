"""``plugrl-report`` end to end on real short runs of the client: finished, two processes, crashed, empty, old
episode lines, with recordings; and the command's exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import webbrowser
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from extras import need

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs.point.point_env import PointEnvConfig
from plugrl_env_client.report.cli import _open, main

mpimg = need("matplotlib.image")

POOLED = [f"{q}_{axis}.png" for q in ("return", "length", "success") for axis in ("env_steps", "wall_time")]
EXPECTED = [*POOLED, "length_histogram.png", "throughput.png", "time_split.png"]
BY_PROCESS = [name.replace(".png", "_by_process.png") for name in POOLED]


def real_run(tmp_path_factory: pytest.TempPathFactory, num_procs: int) -> Path:
    out = tmp_path_factory.mktemp(f"runs{num_procs}")
    config = ClientConfig(num_envs=4, num_procs=num_procs, num_episodes=30, local_policy="random", exp_name="r",
                          output_dir=out, progress=False, env=PointEnvConfig())
    assert run_client(config, "Point-v1") == 0
    return out / "r"


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory, 2)


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A private copy: each test changes and reports on its own folder, never the shared run."""
    return Path(shutil.copytree(run, tmp_path / run.name))


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.src: list[str] = []
        self.href: list[str] = []
        self.videos: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if href:
            self.href.append(href)
        src = dict(attrs).get("src")
        if src:
            self.src.append(src)
            if tag == "video":
                self.videos.append(src)


def links(page: Path) -> Links:
    parser = Links()
    parser.feed(page.read_text())
    return parser


def figures(root: Path) -> set[str]:
    return {p.name for p in (root / "report").glob("*.png")}


def assert_real_png(path: Path) -> None:
    assert path.stat().st_size > 3000, f"{path.name} is too small to hold a figure"
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 150 and image.shape[1] >= 400, f"{path.name}: {image.shape}"
    assert image[..., :3].std() > 0.01, f"{path.name} is blank"


def assert_page_is_sound(root: Path) -> str:
    """Every figure under report/ is on the page, every src exists, and no number is NaN or infinite."""
    page = root / "report.html"
    srcs = links(page).src
    for name in figures(root):
        assert f"report/{name}" in srcs, f"{name} is not on the page"
    for src in srcs:
        assert (root / src).is_file(), f"the page links {src}, which does not exist"
    text = page.read_text()
    assert not re.search(r"\b(nan|NaN|inf|Infinity)\b", text)
    return text


@pytest.mark.slow
def test_report_of_a_finished_run(one_proc, tmp_path, capsys):
    root = copy_of(one_proc, tmp_path)
    assert main([str(root)]) == 0
    out = capsys.readouterr().out
    assert f"report: {root / 'report.html'}" in out
    assert set(EXPECTED) <= figures(root)
    assert not set(BY_PROCESS) & figures(root), "one process: its own figures would repeat the pooled ones"
    for name in EXPECTED:
        assert_real_png(root / "report" / name)
    text = assert_page_is_sound(root)
    summary = json.loads((root / "summary.json").read_text())
    assert f"<td>{summary['completed_episodes']}</td>" in text
    assert f"{summary['all_episodes']['mean_return']:.4f}" in text


@pytest.mark.slow
def test_report_from_a_subprocess(one_proc, tmp_path):
    root = copy_of(one_proc, tmp_path)
    done = subprocess.run([sys.executable, "-m", "plugrl_env_client.report.cli", str(root), "--window", "3"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "report.html" in done.stdout
    assert "moving averages over 3 episodes (--window)" in (root / "report.html").read_text()
    assert set(EXPECTED) <= figures(root)


def with_metric(root: Path, name: str) -> None:
    """Give every episode of the run's process 0 the metric ``name``, as an env reporting it would."""
    episodes = root / "rollout/proc_000/episodes.jsonl"
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    for i, row in enumerate(rows):
        row["metrics"] = {name: float(i % 5)}
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_metric_named_like_mathtext_is_plotted_as_written(one_proc, tmp_path):
    root = copy_of(one_proc, tmp_path)
    with_metric(root, "x$^$")
    done = subprocess.run([sys.executable, "-m", "plugrl_env_client.report.cli", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert_real_png(root / "report" / "metric_x.png")
    text = assert_page_is_sound(root)
    assert 'alt="x$^$"' in text and "<strong>x$^$</strong>" in text


def test_a_figure_that_cannot_be_drawn_is_skipped_with_one_warning(one_proc, tmp_path, monkeypatch, capsys):
    from plugrl_env_client.report import plots

    def broken(run, out):
        raise ValueError("cannot draw this\n   ^ and a second line")

    monkeypatch.setattr(plots, "draw_length_histogram", broken)
    root = copy_of(one_proc, tmp_path)
    assert main([str(root)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: the figure 'episode lengths' could not be drawn and is left out (ValueError: cannot "
                   "draw this)"]
    assert "length_histogram.png" not in figures(root)
    assert set(EXPECTED) - {"length_histogram.png"} <= figures(root)
    text = assert_page_is_sound(root)
    assert "the figure &#x27;episode lengths&#x27; could not be drawn and is left out" in text


@pytest.mark.slow
def test_two_processes_get_per_process_series(two_procs, tmp_path):
    root = copy_of(two_procs, tmp_path)
    assert main([str(root)]) == 0
    assert set(EXPECTED + BY_PROCESS) <= figures(root)
    for name in BY_PROCESS:
        assert_real_png(root / "report" / name)
    text = assert_page_is_sound(root)
    assert "<td>process 0</td>" in text and "<td>process 1</td>" in text and "<td>all</td>" in text


@pytest.mark.slow
def test_crashed_run_reports_from_its_episodes(two_procs, tmp_path, capsys):
    root = copy_of(two_procs, tmp_path)
    for summary in root.rglob("summary.json"):
        summary.unlink()
    episodes = root / "rollout/proc_001/episodes.jsonl"
    lines = episodes.read_text().splitlines()
    episodes.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert main([str(root)]) == 0
    text = assert_page_is_sound(root)
    assert "no summary.json for processes 0, 1" in text
    assert "1 in process 1" in text, "the cut line is skipped and counted"
    assert f'<td>process 1</td><td class="text">no summary</td><td>{len(lines) - 1}</td>' in text
    assert {"return_env_steps.png", "throughput.png"} <= figures(root)
    assert "time_split.png" not in figures(root), "no summary, no timing"
    assert capsys.readouterr().err == ""


def test_run_with_zero_episodes(one_proc, tmp_path):
    root = copy_of(one_proc, tmp_path)
    for summary in root.rglob("summary.json"):
        summary.unlink()
    (root / "rollout/proc_000/episodes.jsonl").write_text("")
    assert main([str(root)]) == 0
    assert figures(root) == set(), "no plots of nothing"
    text = assert_page_is_sound(root)
    assert "No episode has finished in this run yet" in text
    assert '<td>process 0</td><td class="text">no summary</td><td>0</td><td>n/a</td><td>n/a</td><td>n/a</td>' in text


def test_a_run_that_failed_before_any_episode_says_why_and_where_its_log_is(tmp_path, capsys):
    from faulty_env import FaultyConfig  # tests/_support, on sys.path (conftest)

    config = ClientConfig(num_envs=2, num_episodes=2, local_policy="random", exp_name="broken", output_dir=tmp_path,
                          progress=False, env=FaultyConfig(fail_in_init=True))
    assert run_client(config, "Faulty-v1") == 1
    capsys.readouterr()
    root = tmp_path / "broken"
    assert main([str(root)]) == 0
    text = assert_page_is_sound(root)
    assert "The run failed before any episode finished, so there is nothing to plot." in text
    assert re.search(r"Its error \(summary.json\): process 0: [^<]*simulator license not found", text)
    assert 'Its log: <a href="logs/client.log">logs/client.log</a>.' in text
    assert "simulator license not found" in (root / "logs/client.log").read_text()
    assert "Run the report again once episodes are written" not in text
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_old_episode_lines_still_report(one_proc, tmp_path):
    root = copy_of(one_proc, tmp_path)
    episodes = root / "rollout/proc_000/episodes.jsonl"
    keep = ("env_index", "return", "length", "success", "terminated", "truncated")
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    episodes.write_text("".join(json.dumps({k: r[k] for k in keep}) + "\n" for r in rows))
    assert main([str(root)]) == 0
    names = figures(root)
    assert {"return_env_steps.png", "length_env_steps.png", "length_histogram.png"} <= names
    assert not {n for n in names if "wall_time" in n} and "throughput.png" not in names
    text = assert_page_is_sound(root)
    assert "no wall_time_s in the episodes of process 0" in text
    assert "estimated as cumulative episode lengths" in text


@pytest.mark.slow
def test_sampled_frames_and_videos_are_shown(one_proc, tmp_path):
    imageio = need("imageio")
    root = copy_of(one_proc, tmp_path)
    proc = root / "rollout/proc_000"
    (proc / "sampled").mkdir()
    (proc / "videos").mkdir()
    frame = np.zeros((32, 32, 3), np.uint8)
    frame[8:24, 8:24] = (255, 128, 0)
    mpimg.imsave(proc / "sampled/ep000000_first_base.png", frame)
    mpimg.imsave(proc / "sampled/ep000000_last_base.png", frame[::-1])
    frames = [np.roll(frame, k, axis=1) for k in range(8)]
    imageio.mimwrite(proc / "videos/ep000000_base.mp4", frames, fps=4)
    assert main([str(root)]) == 0
    page = links(root / "report.html")
    for name in ("ep000000_first_base.png", "ep000000_last_base.png"):
        shown = f"report/thumbs/proc_000__sampled__{name}"
        assert shown in page.src and f"rollout/proc_000/sampled/{name}" in page.href
        assert mpimg.imread(root / shown).shape[:2] == (160, 160), "a 32 px frame is shown 5 times as large"
    assert page.videos == ["rollout/proc_000/videos/ep000000_base.mp4"]
    assert (proc / "videos/ep000000_base.mp4").stat().st_size > 0
    assert_page_is_sound(root)


def test_not_a_run_folder_is_exit_1_with_a_message(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is not a run folder: it has no client_config.json and no rollout/ folder" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("flag, code", [(["--window", "0"], 1), (["--window", "many"], 2), (["--no-such-flag"], 2)])
def test_bad_flags_exit_as_for_every_command(one_proc, tmp_path, flag, code, capsys):
    """A value the report refuses is a user error (1); a command line the parser refuses is a usage error (2)."""
    root = copy_of(one_proc, tmp_path)
    assert main([str(root), *flag]) == code
    assert "Traceback" not in capsys.readouterr().err
    assert not (root / "report.html").exists()


@pytest.mark.slow
def test_open_hands_the_page_to_a_browser(one_proc, tmp_path, monkeypatch, capsys):
    root = copy_of(one_proc, tmp_path)
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    assert main([str(root), "--open"]) == 0
    assert opened == [(root / "report.html").resolve().as_uri()]


def test_open_without_a_browser_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(webbrowser, "open", lambda url: False)
    _open(tmp_path / "report.html")
    assert f"no web browser could be started; open {tmp_path / 'report.html'} yourself" in capsys.readouterr().err


def test_a_folder_the_report_cannot_be_written_into_is_exit_1(one_proc, tmp_path, capsys):
    root = copy_of(one_proc, tmp_path)
    (root / "report").write_text("a file where the figures go")
    assert main([str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not write the report into") and "Traceback" not in err
