"""The report's figures, drawn with matplotlib's Agg canvas straight to PNG files.

matplotlib is an optional extra: it is imported here only, when the first figure is drawn, and a missing install
is a ConfigError naming the extra. Figures are built on ``matplotlib.figure.Figure`` with an Agg canvas rather than
through pyplot, so drawing a report neither switches the backend of a program that imported this module nor keeps
figures alive in pyplot's registry.

No figure is drawn from an empty series, and every array handed to matplotlib is filtered to finite values first:
a plot of nothing is left out, never drawn as an empty frame or a NaN line.

Text that comes from the run (metric names, labels) is drawn as written: every figure is made and saved with
matplotlib's ``text.parse_math`` and ``text.usetex`` off, so a metric named ``x$^$`` is a label, not a mathtext
expression that fails to parse. A figure that cannot be drawn for any other reason is left out and named in
:attr:`Figures.skipped`; the other figures and the page do not depend on it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.report.data import (
    EpisodeSeries,
    RunData,
    moving_average,
    step_curve,
    throughput,
    throughput_edges,
    time_splits,
)

INSTALL_HINT = 'pip install "plugrl-env-client[report]"'
DPI = 100
SIZE = (6.4, 3.6)
MAX_RAW_POINTS = 20_000
MAX_LEGEND = 12
MAX_METRICS = 40
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}
"""matplotlib settings every figure is drawn under: text from the run is shown as written, never parsed."""
PART_COLORS = {"env step": "#4c72b0", "infer wait": "#dd8452", "packing": "#55a868", "feedback": "#8172b3",
               "reset": "#c44e52", "other": "#b0b0b0"}


@dataclasses.dataclass(frozen=True)
class PlotFile:
    """A PNG written under the report folder, with what the page says about it."""

    name: str
    section: str
    title: str
    caption: str


@dataclasses.dataclass(frozen=True)
class SkippedFigure:
    """A figure the data called for that could not be drawn."""

    title: str
    reason: str

    @property
    def message(self) -> str:
        """One line for the console and the page."""
        return f"the figure '{self.title}' could not be drawn and is left out ({self.reason})"


@dataclasses.dataclass(frozen=True)
class Figures:
    """What :func:`draw_all` wrote, and what it had to leave out."""

    made: list[PlotFile]
    skipped: list[SkippedFigure]


def require_matplotlib() -> Any:
    """The matplotlib module, or a ConfigError saying which extra installs it."""
    try:
        import matplotlib
        from matplotlib.backends import backend_agg  # noqa: F401  (the canvas every figure is drawn on)
    except ImportError as exc:
        raise ConfigError(f"plugrl-report draws its figures with matplotlib, which is not installed: "
                          f"{INSTALL_HINT} ({exc})") from exc
    return matplotlib


def _figure(height: float = SIZE[1], width: float = SIZE[0]) -> Any:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    """The figure as ``path``, whole or not at all (a drawing error leaves no partial PNG behind)."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        fig.savefig(partial, dpi=DPI, format="png")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _finite_pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) pairs where both are finite: the only values a figure is ever given."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _thin(x: np.ndarray, y: np.ndarray, limit: int = MAX_RAW_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th point, so a scatter of a million episodes draws in a second and still shows the spread."""
    if x.size <= limit:
        return x, y
    stride = int(np.ceil(x.size / limit))
    return x[::stride], y[::stride]


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"] if n <= 10 else colormaps["viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]


# ------------------------------------------------------------------------------------------------ figures


QUANTITIES: dict[str, tuple[str, str, Callable[[EpisodeSeries], np.ndarray]]] = {
    # name: (section, y label, column)
    "return": ("returns", "episode return", lambda s: s.returns),
    "length": ("lengths", "episode length", lambda s: s.lengths.astype(np.float64)),
    "success": ("success", "success rate", lambda s: s.success),
}
AXES = {"env_steps": "env steps", "wall_time": "wall time (s)"}
AXIS_TITLES = {"env_steps": "env steps", "wall_time": "wall time"}


def _title(quantity: str, axis: str, per_process: bool = False) -> str:
    return f"{QUANTITIES[quantity][1]} against {AXIS_TITLES[axis]}" + (", per process" if per_process else "")


def _x_of(series: EpisodeSeries, axis: str) -> np.ndarray | None:
    return series.env_steps if axis == "env_steps" else series.wall_time_s


def draw_pooled(run: RunData, quantity: str, axis: str, window: int, out: Path) -> PlotFile | None:
    """A quantity of every episode against the run's env steps or wall time, raw and averaged."""
    section, label, column = QUANTITIES[quantity]
    xs = _x_of(run.pooled, axis)
    if xs is None or len(run.pooled) == 0:
        return None
    x, y = _finite_pairs(xs, column(run.pooled))
    if x.size == 0:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    if quantity != "success":  # raw 0/1 successes are noise; their average is the rate
        rx, ry = _thin(x, y)
        ax.scatter(rx, ry, s=10, alpha=0.45, color="#7f7f7f", linewidths=0, label="episodes")
    ax.plot(x, moving_average(y, window), color="#1f4e9c", linewidth=2, label=f"moving average ({window} episodes)")
    _style(ax, AXES[axis] + (" (all processes)" if axis == "env_steps" else ""), label, quantity, points=x.size)
    name = f"{quantity}_{axis}.png"
    _save(fig, out / name)
    shown = "Every episode of every process (grey) and the" if quantity != "success" else \
        f"Over the {x.size} episodes judged for success, the"
    return PlotFile(name, section, _title(quantity, axis),
                    f"{shown} moving average over {window} episodes.")


def draw_by_process(run: RunData, quantity: str, axis: str, window: int, out: Path) -> PlotFile | None:
    """The moving average of a quantity for each process, each against its own env steps or wall time."""
    section, label, column = QUANTITIES[quantity]
    ran = [p for p in run.processes if len(p.episodes) and _x_of(p.episodes, axis) is not None]
    if len(ran) < 2:
        return None  # one process: the pooled figure already is its figure
    fig = _figure()
    ax = fig.add_subplot()
    drew = False
    for p, color in zip(ran, _colors(len(ran))):
        xs = _x_of(p.episodes, axis)
        assert xs is not None
        x, y = _finite_pairs(xs, column(p.episodes))
        if x.size:
            ax.plot(x, moving_average(y, window), color=color, linewidth=1.5, label=f"process {p.process_id}")
            drew = True
    if not drew:
        return None
    _style(ax, AXES[axis] + (" of the process" if axis == "env_steps" else ""), label, quantity, len(ran),
           points=len(run.pooled))
    name = f"{quantity}_{axis}_by_process.png"
    _save(fig, out / name)
    return PlotFile(name, section, _title(quantity, axis, per_process=True),
                    f"Moving average over {window} episodes of each process.")


def _style(ax: Any, xlabel: str, ylabel: str, quantity: str, lines: int = 1, points: int = 0) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if quantity == "success":
        ax.set_ylim(-0.03, 1.03)
    if lines <= MAX_LEGEND:
        # "best" tests every data point against candidate spots: seconds for a long run, so only for short ones
        ax.legend(fontsize="small", loc="best" if points <= 5000 else "upper left")


def draw_length_histogram(run: RunData, out: Path) -> PlotFile | None:
    """Episode lengths, stacked by how the episode ended (terminated by the env, truncated by a limit)."""
    lengths = run.pooled.lengths
    if lengths.size == 0:
        return None
    low, high = int(lengths.min()), int(lengths.max())
    edges = np.arange(low, high + 2) - 0.5 if high - low < 60 else np.linspace(low, high, 51)
    groups = [("terminated", run.pooled.terminated, "#4c72b0"),
              ("truncated", run.pooled.truncated & ~run.pooled.terminated, "#dd8452"),
              ("neither", ~run.pooled.terminated & ~run.pooled.truncated, "#b0b0b0")]
    shown = [(name, lengths[mask].astype(np.float64), color) for name, mask, color in groups if mask.any()]
    fig = _figure()
    ax = fig.add_subplot()
    ax.hist([v for _, v, _ in shown], bins=edges, stacked=True, label=[n for n, _, _ in shown],
            color=[c for _, _, c in shown])
    ax.set_xlabel("episode length")
    ax.set_ylabel("episodes")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    name = "length_histogram.png"
    _save(fig, out / name)
    return PlotFile(name, "lengths", "episode lengths", f"{lengths.size} episodes, by how they ended.")


def draw_throughput(run: RunData, out: Path) -> PlotFile | None:
    """Env steps per second over wall time, per process and in total, from the episodes' counts and times."""
    curves: list[tuple[int, np.ndarray, np.ndarray]] = []
    for p in run.processes:
        if not len(p.episodes) or p.episodes.wall_time_s is None:
            continue
        timing = (p.summary or {}).get("timing") or {}
        end = None
        if p.steps_recorded and isinstance(timing.get("collect_time_s"), (int, float)) \
                and isinstance(timing.get("env_steps"), (int, float)):
            end = (float(timing["collect_time_s"]), float(timing["env_steps"]))
        t, s = step_curve(p.episodes.wall_time_s, p.episodes.env_steps, end)
        curves.append((p.process_id, t, s))
    if not curves:
        return None
    t_end = max(float(t[-1]) for _, t, _ in curves)
    if not np.isfinite(t_end) or t_end <= 0:
        return None
    edges = throughput_edges(t_end, len(run.pooled))
    rates = [(pid, throughput(t, s, edges)) for pid, t, s in curves]
    fig = _figure()
    ax = fig.add_subplot()
    if len(rates) > 1:
        for (pid, r), color in zip(rates, _colors(len(rates))):
            ax.stairs(r, edges, baseline=None, color=color, linewidth=1.2, label=f"process {pid}")
    ax.stairs(np.sum([r for _, r in rates], axis=0), edges, baseline=None, color="black", linewidth=2, label="total")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("env steps / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if len(rates) + 1 <= MAX_LEGEND:
        ax.legend(fontsize="small")
    name = "throughput.png"
    _save(fig, out / name)
    estimated = "" if run.steps_recorded else " Env steps are estimated from episode lengths."
    return PlotFile(name, "throughput", "throughput over time",
                    f"Env steps per second in {edges.size - 1} time bins, interpolated between episode ends."
                    + estimated)


def draw_time_split(run: RunData, out: Path) -> PlotFile | None:
    """Where each process's collection time went: a stacked bar per process from its summary's timing."""
    splits = time_splits(run)
    if not splits:
        return None
    fig = _figure(height=min(1.6 + 0.35 * len(splits), 12.0))
    ax = fig.add_subplot()
    rows = np.arange(len(splits))
    left = np.zeros(len(splits))
    labels = [name for name in PART_COLORS if any(name in s.parts for s in splits)]
    for part in labels:
        widths = np.array([s.parts.get(part, 0.0) for s in splits])
        ax.barh(rows, widths, left=left, color=PART_COLORS[part], label=part, height=0.7)
        left += widths
    ax.set_yticks(rows, [f"process {s.process_id}" for s in splits])
    ax.invert_yaxis()
    ax.set_xlabel("seconds of collection")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize="small", ncols=len(labels), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    name = "time_split.png"
    _save(fig, out / name)
    return PlotFile(name, "throughput", "time split per process",
                    "Collection time of each process (from its summary): stepping the envs, waiting for actions, "
                    "packing observations, sending feedback (when the summary times it), resets, and the rest.")


def draw_metric(run: RunData, metric: str, window: int, out: Path, name: str) -> PlotFile | None:
    """One episode metric against the run's env steps, raw and averaged."""
    x, y = _finite_pairs(run.pooled.env_steps, run.pooled.metrics[metric])
    if x.size == 0:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    rx, ry = _thin(x, y)
    ax.scatter(rx, ry, s=10, alpha=0.45, color="#7f7f7f", linewidths=0, label="episodes")
    ax.plot(x, moving_average(y, window), color="#1f4e9c", linewidth=2, label=f"moving average ({window} episodes)")
    _style(ax, "env steps (all processes)", metric, "metric", points=x.size)
    _save(fig, out / name)
    return PlotFile(name, "metrics", metric, f"{x.size} episodes report it.")


def draw_all(run: RunData, window: int, out: Path) -> Figures:
    """Every figure the run's data supports, written to ``out``; one that fails to draw is skipped, not fatal."""
    matplotlib = require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    quantities = [q for q in QUANTITIES if q != "success" or run.success_defined]
    jobs: list[tuple[str, Callable[[], PlotFile | None]]] = []
    for quantity in quantities:
        for axis in AXES:
            jobs.append((_title(quantity, axis), functools.partial(draw_pooled, run, quantity, axis, window, out)))
            jobs.append((_title(quantity, axis, per_process=True),
                         functools.partial(draw_by_process, run, quantity, axis, window, out)))
        if quantity == "length":
            jobs.append(("episode lengths", functools.partial(draw_length_histogram, run, out)))
    jobs.append(("throughput over time", functools.partial(draw_throughput, run, out)))
    jobs.append(("time split per process", functools.partial(draw_time_split, run, out)))
    for metric, name in metric_files(list(run.pooled.metrics)[:MAX_METRICS]).items():
        jobs.append((metric, functools.partial(draw_metric, run, metric, window, out, name)))
    made: list[PlotFile] = []
    skipped: list[SkippedFigure] = []
    for title, draw in jobs:
        try:
            with matplotlib.rc_context(PLAIN_TEXT):
                figure = draw()
        except Exception as exc:  # one figure's failure must not cost the page or the other figures
            skipped.append(SkippedFigure(title, _one_line(exc)))
            continue
        if figure is not None:
            made.append(figure)
    return Figures(made, skipped)


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: matplotlib's parse errors span several lines."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def metric_files(names: list[str]) -> dict[str, str]:
    """A distinct, file-system-safe PNG name per metric name."""
    files: dict[str, str] = {}
    for name in names:
        stem = "metric_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "unnamed")[:60]
        candidate, k = stem, 1
        while candidate + ".png" in files.values():
            k += 1
            candidate = f"{stem}_{k}"
        files[name] = candidate + ".png"
    return files


def make_thumbnail(src: Path, dst: Path, max_px: int) -> bool:
    """A copy of a PNG sized for the page; False if it cannot be read.

    A large image is shrunk to at most ``max_px`` on its longer side (block-averaged). A small one (an 8x8 grid
    world, a 64x64 frame) is enlarged by the largest whole factor that keeps it within ``max_px``, each pixel
    repeated into a square block (nearest neighbour): it is shown big and its pixels stay sharp, whatever the
    browser's scaling. An image already between half of ``max_px`` and ``max_px`` is copied as it is.
    """
    require_matplotlib()
    from matplotlib import image as mpimg

    try:
        image = np.asarray(mpimg.imread(src))
    except (OSError, ValueError, SyntaxError):
        return False
    if image.ndim not in (2, 3) or image.size == 0:
        return False
    longer = max(image.shape[:2])
    k = int(np.ceil(longer / max_px))
    if k > 1:
        h, w = (image.shape[0] // k) * k, (image.shape[1] // k) * k
        cropped = image[:h, :w]
        image = cropped.reshape(h // k, k, w // k, k, *cropped.shape[2:]).mean(axis=(1, 3))
    elif (up := max_px // longer) > 1:
        image = np.repeat(np.repeat(image, up, axis=0), up, axis=1)
    image = np.clip(np.nan_to_num(image.astype(np.float64)), 0.0, 1.0)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if image.ndim == 2:
        mpimg.imsave(dst, image, cmap="gray", vmin=0.0, vmax=1.0)
    else:
        mpimg.imsave(dst, image)
    return True


SUITE_BARS = (("mean_return", "mean return", "suite_returns.png"),
              ("success_rate", "success rate", "suite_success.png"),
              ("mean_length", "mean episode length", "suite_lengths.png"))
"""The bar charts of a suite's report: the key of suite.json's tasks, its label, the figure's file."""


def draw_suite_bars(tasks: list[dict[str, Any]], out: Path) -> Figures:
    """One bar chart per quantity of :data:`SUITE_BARS` with a bar per task (tasks without a value, e.g. no
    success rule or no episode yet, are named with "n/a" and get no bar); a quantity no task has is left out."""
    matplotlib = require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    made: list[PlotFile] = []
    skipped: list[SkippedFigure] = []
    names = [str(t.get("name", "?")) for t in tasks]
    for key, label, name in SUITE_BARS:
        values: list[Any] = [t.get(key) for t in tasks]
        finite = [isinstance(v, (int, float)) and np.isfinite(v) for v in values]
        if not any(finite):
            continue
        try:
            with matplotlib.rc_context(PLAIN_TEXT):
                fig = _figure(height=max(SIZE[1], 0.35 * len(tasks) + 1.0))
                ax = fig.add_subplot()
                rows = np.arange(len(tasks))
                shown = np.array([float(v) if ok else 0.0 for v, ok in zip(values, finite)])
                ax.barh(rows[finite], shown[finite], color="#4c72b0")
                ax.set_yticks(rows, [n if ok else f"{n} (n/a)" for n, ok in zip(names, finite)])
                ax.invert_yaxis()
                ax.set_xlabel(label)
                ax.grid(alpha=0.3, axis="x")
                if key == "success_rate":
                    ax.set_xlim(0.0, 1.0)
                _save(fig, out / name)
        except Exception as exc:  # a figure that cannot be drawn is left out, the page says why
            skipped.append(SkippedFigure(f"{label} per task", _one_line(exc)))
            continue
        made.append(PlotFile(name, "suite", f"{label} per task",
                             f"{sum(finite)} of {len(tasks)} task{'s' if len(tasks) != 1 else ''} have a value."))
    return Figures(made, skipped)
