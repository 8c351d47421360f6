"""Building a report: read the run folder, draw the figures and thumbnails, write ``report.html`` beside them.

The page is written last and atomically (temp file + rename), so a browser reloading it while a report is being
rebuilt for a run that is still going sees the old page or the new one, never half of one. Figures from an earlier
report are removed first: a figure the data no longer supports must not linger next to the new page.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.run_dir import write_text_atomic
from plugrl_env_client.report import html, plots
from plugrl_env_client.report.data import default_window, load_run, summary_rows
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
                     skipped=[s.message for s in drawn.skipped])
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


def _clear_old_figures(out: Path) -> None:
    for folder in (out, out / THUMB_DIR):
        if folder.is_dir():
            for old in folder.glob("*.png"):
                old.unlink(missing_ok=True)


