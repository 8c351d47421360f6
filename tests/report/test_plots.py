"""Figures: drawn only from data that exists, never handed a non-finite value, and a clear error without matplotlib."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from extras import need

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.report import plots
from plugrl_env_client.report.data import load_run

mpimg = need("matplotlib.image")
Axes = need("matplotlib.axes").Axes


def write_episodes(root: Path, pid: int, rows: list[dict]) -> None:
    folder = root / "rollout" / f"proc_{pid:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def rows(n: int, **extra) -> list[dict]:
    return [{"env_index": 0, "return": float(i), "length": 10 + i % 7, "success": i % 3 == 0, "terminated": True,
             "truncated": False, "wall_time_s": 0.1 * (i + 1), "env_steps": 40 * (i + 1), **extra}
            for i in range(n)]


@pytest.fixture
def finite_only(monkeypatch):
    """Let every plotting call through, after checking that all it is given is finite."""
    seen: list[str] = []

    def checked(name):
        original = getattr(Axes, name)

        def call(self, *args, **kwargs):
            for a in args:
                if isinstance(a, (np.ndarray, list)) and np.asarray(a).dtype.kind == "f":
                    assert np.isfinite(np.asarray(a)).all(), f"{name} was handed a non-finite value"
            seen.append(name)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(Axes, name, call)

    for name in ("plot", "scatter", "stairs", "hist", "barh"):
        checked(name)
    return seen


@pytest.mark.slow
def test_non_finite_values_never_reach_matplotlib(tmp_path, finite_only):
    data = rows(30, metrics={"d": 1.0})
    data[4]["return"] = None
    data[5]["metrics"] = {"d": None}
    data[6]["success"] = None
    write_episodes(tmp_path, 0, data)
    drawn = plots.draw_all(load_run(tmp_path), 5, tmp_path / "out")
    assert drawn.skipped == [], "a check that failed inside a figure would show as a skipped figure"
    assert {"return_env_steps.png", "metric_d.png", "success_wall_time.png"} <= {m.name for m in drawn.made}
    assert {"plot", "scatter", "stairs", "hist"} <= set(finite_only)


def test_an_empty_run_draws_nothing(tmp_path):
    write_episodes(tmp_path, 0, [])
    run = load_run(tmp_path)
    assert plots.draw_all(run, 5, tmp_path / "out") == plots.Figures([], [])
    assert list((tmp_path / "out").iterdir()) == []


def test_a_metric_without_a_finite_value_gets_no_figure(tmp_path):
    write_episodes(tmp_path, 0, rows(5, metrics={"x": 1.0}))
    run = load_run(tmp_path)
    run.pooled.metrics["x"][:] = np.nan
    assert plots.draw_metric(run, "x", 5, tmp_path, "m.png") is None
    assert not (tmp_path / "m.png").exists()


@pytest.mark.slow
def test_all_returns_null_gives_no_return_figure(tmp_path):
    write_episodes(tmp_path, 0, rows(5, **{"return": None}))
    names = {m.name for m in plots.draw_all(load_run(tmp_path), 5, tmp_path / "out").made}
    assert not {n for n in names if n.startswith("return")}
    assert "length_env_steps.png" in names


def test_names_from_the_run_are_drawn_as_plain_text_not_mathtext(tmp_path):
    names = ["x$^$", "$\\frac{1", "a_{b}$ and $c^", "50% $$"]
    write_episodes(tmp_path, 0, rows(8, metrics={n: 1.5 for n in names}))
    drawn = plots.draw_all(load_run(tmp_path), 3, tmp_path / "out")
    assert drawn.skipped == []
    made = {m.title: m for m in drawn.made}
    for name, file in plots.metric_files(names).items():
        assert made[name].name == file and mpimg.imread(tmp_path / "out" / file).shape[:2] == (360, 640)


def test_a_figure_that_fails_is_skipped_and_named_the_others_are_drawn(tmp_path, monkeypatch):
    write_episodes(tmp_path, 0, rows(12, metrics={"d": 1.0}))

    def broken(run, out):
        raise RuntimeError("no room for the legend\nsecond line")

    monkeypatch.setattr(plots, "draw_throughput", broken)
    drawn = plots.draw_all(load_run(tmp_path), 3, tmp_path / "out")
    assert [(s.title, s.reason) for s in drawn.skipped] == [("throughput over time",
                                                           "RuntimeError: no room for the legend")]
    assert drawn.skipped[0].message == ("the figure 'throughput over time' could not be drawn and is left out "
                                        "(RuntimeError: no room for the legend)")
    names = {m.name for m in drawn.made}
    assert {"return_env_steps.png", "length_histogram.png", "metric_d.png"} - names == set()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)


def test_a_figure_failing_while_saved_leaves_no_partial_file(tmp_path, monkeypatch):
    write_episodes(tmp_path, 0, rows(6))
    Figure = need("matplotlib.figure").Figure
    real_savefig = Figure.savefig

    def half_written(self, fname, *args, **kwargs):
        real_savefig(self, fname, *args, **kwargs)
        raise OSError("disk went away")

    monkeypatch.setattr(Figure, "savefig", half_written)
    drawn = plots.draw_all(load_run(tmp_path), 3, tmp_path / "out")
    assert drawn.made == [] and len(drawn.skipped) >= 5
    assert list((tmp_path / "out").iterdir()) == []


def test_figures_are_the_set_size(tmp_path):
    write_episodes(tmp_path, 0, rows(12))
    made = plots.draw_pooled(load_run(tmp_path), "length", "env_steps", 3, tmp_path)
    assert made is not None and made.section == "lengths" and "3 episodes" in made.caption
    image = mpimg.imread(tmp_path / made.name)
    assert image.shape[:2] == (360, 640)


def test_a_single_process_gets_no_per_process_figure_two_do(tmp_path):
    write_episodes(tmp_path, 0, rows(6))
    assert plots.draw_by_process(load_run(tmp_path), "return", "wall_time", 3, tmp_path) is None
    write_episodes(tmp_path, 1, rows(6))
    made = plots.draw_by_process(load_run(tmp_path), "return", "wall_time", 3, tmp_path)
    assert made is not None and (tmp_path / made.name).stat().st_size > 3000


def test_metric_file_names_are_safe_and_distinct():
    files = plots.metric_files(["a/b", "a b", "..", "x" * 100])
    assert files["a/b"] == "metric_a_b.png" and files["a b"] == "metric_a_b_2.png"
    assert files[".."] == "metric_unnamed.png"
    assert len(files["x" * 100]) == len("metric_") + 60 + len(".png")


def gray_png(width: int, height: int) -> bytes:
    """A one-channel (grayscale) PNG, which reads back as a 2-D array."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes((x * 255 // max(width - 1, 1)) for x in range(width)) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_thumbnails_shrink_colour_and_grayscale_images(tmp_path):
    mpimg.imsave(tmp_path / "rgb.png", np.random.default_rng(0).random((300, 200, 3)))
    assert plots.make_thumbnail(tmp_path / "rgb.png", tmp_path / "t/rgb.png", 100)
    assert mpimg.imread(tmp_path / "t/rgb.png").shape[:2] == (100, 66)
    (tmp_path / "gray.png").write_bytes(gray_png(400, 240))
    assert mpimg.imread(tmp_path / "gray.png").ndim == 2
    assert plots.make_thumbnail(tmp_path / "gray.png", tmp_path / "t/gray.png", 80)
    small = mpimg.imread(tmp_path / "t/gray.png")
    assert small.shape[:2] == (48, 80)
    assert small[0, 0, 0] < 0.1 and small[0, -1, 0] > 0.9, "the left-to-right ramp survives"
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert not plots.make_thumbnail(tmp_path / "broken.png", tmp_path / "t/broken.png", 80)


def test_small_images_are_enlarged_by_a_whole_factor_with_sharp_pixels(tmp_path):
    (tmp_path / "gray.png").write_bytes(gray_png(16, 9))
    assert plots.make_thumbnail(tmp_path / "gray.png", tmp_path / "t/gray.png", 160)
    original = np.round(mpimg.imread(tmp_path / "gray.png") * 255)
    big = np.round(mpimg.imread(tmp_path / "t/gray.png")[..., 0] * 255)
    assert big.shape == (90, 160)
    assert np.array_equal(big, np.repeat(np.repeat(original, 10, axis=0), 10, axis=1))
    mpimg.imsave(tmp_path / "mid.png", np.random.default_rng(0).random((90, 100, 3)))
    assert plots.make_thumbnail(tmp_path / "mid.png", tmp_path / "t/mid.png", 160)
    assert mpimg.imread(tmp_path / "t/mid.png").shape[:2] == (90, 100), "no whole factor fits: as it is"


def test_missing_matplotlib_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r'pip install "plugrl-env-client\[report\]"'):
        plots.require_matplotlib()


@pytest.mark.slow
def test_importing_the_report_package_does_not_import_matplotlib():
    import subprocess

    code = ("import sys, plugrl_env_client.report, plugrl_env_client.report.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
