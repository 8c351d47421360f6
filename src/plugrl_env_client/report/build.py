"""Building a report: read the run folder, draw the figures and thumbnails, write ``report.html`` beside them.

The page is written last and atomically (temp file + rename), so a browser reloading it while a report is being
rebuilt for a run that is still going sees the old page or the new one, never half of one. Figures from an earlier
report are removed first: a figure the data no longer supports must not linger next to the new page.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.run_dir import write_text_atomic
from plugrl_env_client.report import html, plots
from plugrl_env_client.report.data import RunData, default_window, load_run, summary_rows
from plugrl_env_client.report.media import RunMedia, find_media, png_size

REPORT_PAGE = "report.html"
REPORT_DIR = "report"
THUMB_DIR = "thumbs"
THUMB_PX = 160
"""The size sampled images are shown at: one larger than this on either side is shown as a smaller copy, one at
most half of it on both sides as a copy enlarged by a whole factor (sharp pixels), each linking to the original."""


@dataclasses.dataclass(frozen=True)
class Report:
    page: Path
    figures: list[Path]
    thumbnails: list[Path]
    skipped: list[plots.SkippedFigure] = dataclasses.field(default_factory=list)
    """Figures that could not be drawn (the page says so, and so does the command)."""


def build_report(root: Path, window: int | None = None) -> Report:
    """Write ``<root>/report.html`` and its figures under ``<root>/report/``; raises ConfigError on user errors."""
    if window is not None and window < 1:
        raise ConfigError(f"--window must be >= 1 (episodes in each moving average), got {window}")
    plots.require_matplotlib()  # before any work: a missing extra is the first thing to hear about
    run = load_run(root)
    k = window if window is not None else default_window(len(run.pooled))
    out = root / REPORT_DIR
    _clear_old_figures(out)
    drawn = plots.draw_all(run, k, out)
    media = find_media([(p.process_id, p.folder) for p in run.processes])
    thumbnails = _thumbnails(media, out / THUMB_DIR, root)
    page = html.Page(run=run, rows=summary_rows(run), plots=drawn.made, plot_dir=out, media=media,
                     thumbnails=thumbnails, window=k, window_given=window is not None,
                     notes=[*recorder_notes(run), *(s.message for s in drawn.skipped)])
    target = root / REPORT_PAGE
    write_text_atomic(target, html.render(page))
    return Report(target, [out / f.name for f in drawn.made], sorted(set(thumbnails.values())), drawn.skipped)


def _thumbnails(media: RunMedia, folder: Path, root: Path) -> dict[Path, Path]:
    """The copy shown for every sampled image the page shows that is too large or too small to show as it is."""
    made: dict[Path, Path] = {}
    per_process: dict[int, int] = {}
    for sample in media.images:
        per_process[sample.process_id] = per_process.get(sample.process_id, 0) + 1
        if per_process[sample.process_id] > html.MAX_IMAGES_PER_PROCESS:
            continue
        size = png_size(sample.path)
        if size is None or THUMB_PX // 2 < max(size) <= THUMB_PX:
            continue
        rel = sample.path.relative_to(root / "rollout")
        dst = folder / ("__".join(rel.parts[:-1] + (rel.name,)))
        if plots.make_thumbnail(sample.path, dst, THUMB_PX):
            made[sample.path] = dst
    return made


def recorder_drops(run: RunData) -> dict[int, tuple[int, int]]:
    """(episodes, observations) each process's recorder dropped because its writer was behind, for the processes
    that dropped some: from the process's summary (``recorder``), else from its manifest (older runs)."""
    drops: dict[int, tuple[int, int]] = {}
    for p in run.processes:
        counts = (p.summary or {}).get("recorder")
        if not isinstance(counts, dict):
            counts = _manifest(p.folder).get("recorder")
        if not isinstance(counts, dict):
            continue
        episodes, frames = counts.get("episodes_dropped"), counts.get("frames_dropped")
        if isinstance(episodes, int) and episodes > 0:
            drops[p.process_id] = (episodes, frames if isinstance(frames, int) and frames >= 0 else 0)
    return drops


def recorder_notes(run: RunData) -> list[str]:
    """A note on the page when the recorder dropped episodes: their files are missing from the samples and videos."""
    drops = recorder_drops(run)
    if not drops:
        return []
    episodes, frames = sum(e for e, _ in drops.values()), sum(f for _, f in drops.values())
    where = ", ".join(f"{e} in process {pid}" for pid, (e, _) in sorted(drops.items()))
    return [f"the recorder dropped {episodes} recorded episode{'s' if episodes != 1 else ''} ({frames} observations) "
            f"because its writer was behind ({where}): they have no sampled observations or videos. Record fewer "
            "episodes with a larger --recorder.episode-freq"]


def _manifest(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _clear_old_figures(out: Path) -> None:
    for folder in (out, out / THUMB_DIR):
        if folder.is_dir():
            for old in folder.glob("*.png"):
                old.unlink(missing_ok=True)




SUITE_FILE = "suite.json"


def is_suite_folder(root: Path) -> bool:
    """Whether ``root`` is a suite's folder (plugrl-run-suite's ``suite.json``) rather than a run folder."""
    return (root / SUITE_FILE).is_file() and not (root / "client_config.json").exists()


def build_suite_report(root: Path) -> Report:
    """Write ``<root>/report.html`` of a suite's folder: its table and a bar chart per quantity with a bar per task
    (figures under ``<root>/report/``); raises ConfigError when suite.json cannot be read."""
    plots.require_matplotlib()
    try:
        suite = json.loads((root / SUITE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{root / SUITE_FILE}: cannot read the suite's table ({exc}); rerun the suite with "
                          "--resume to write it again") from None
    if not isinstance(suite, dict) or not isinstance(suite.get("tasks"), list):
        raise ConfigError(f"{root / SUITE_FILE} holds no tasks list; is {root} a suite folder of plugrl-run-suite?")
    out = root / REPORT_DIR
    _clear_old_figures(out)
    drawn = plots.draw_suite_bars([t for t in suite["tasks"] if isinstance(t, dict)], out)
    target = root / REPORT_PAGE
    write_text_atomic(target, html.render_suite(suite, root, drawn.made, out, [s.message for s in drawn.skipped]))
    return Report(target, [out / f.name for f in drawn.made], [], drawn.skipped)
