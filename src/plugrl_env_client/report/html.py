"""``report.html``: one self-contained page (inline CSS, no scripts) that links to the figures and recordings.

Every path on the page is relative to the run folder, so the folder can be copied or served as a whole and the
page keeps working. All text from the run (names, instructions, statuses) is escaped, and numbers go through one
formatter that writes ``n/a`` for anything missing or non-finite: the page never shows NaN.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import math
from pathlib import Path
from urllib.parse import quote

from plugrl_env_client.outputs.run_dir import RunDir, finite_json
from plugrl_env_client.records import ProcessStatus
from plugrl_env_client.report.data import RunData, SummaryRow, instruction_rows
from plugrl_env_client.report.media import RunMedia, Sample, describe_state, text_preview
from plugrl_env_client.report.plots import PlotFile

MAX_IMAGES_PER_PROCESS = 48
MAX_OTHER_SAMPLES_PER_PROCESS = 24
MAX_VIDEOS_PER_PROCESS = 12
MAX_INSTRUCTIONS = 15
MAX_ERRORS = 3
"""Errors of a run that ended without episodes quoted on the page (the rest are in summary.json and the log)."""
CONFIG_KEYS = ("env_id", "num_envs", "num_procs", "num_episodes", "local_policy")
"""The flags the page shows in its table (then the server's URL); the full client_config.json is folded below."""
SECTIONS = (("returns", "Returns"), ("success", "Success"), ("lengths", "Episode lengths"),
            ("throughput", "Throughput and time"), ("metrics", "Episode metrics"))

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem auto; max-width: 1400px;
       padding: 0 1rem; color: #222; background: #fafafa; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
.sub { color: #666; margin-top: 0; }
.notes { background: #fff8e1; border: 1px solid #f0d98c; padding: 0.5rem 1rem; border-radius: 6px; }
.notes li { margin: 0.2rem 0; }
table { border-collapse: collapse; background: white; margin: 0.5rem 0; }
th, td { border: 1px solid #ddd; padding: 0.3rem 0.7rem; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
th { background: #f0f0f0; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; background: white; border: 1px solid #e3e3e3; border-radius: 6px; padding: 0.5rem; }
figure.plot { flex: 1 1 600px; max-width: 680px; }
figure.plot img { width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; margin-top: 0.3rem; }
figure.frame img { max-width: 160px; max-height: 160px; image-rendering: pixelated; }
figure.frame figcaption { max-width: 160px; }
figure.video video { width: 320px; max-width: 100%; }
pre { background: white; border: 1px solid #e3e3e3; padding: 0.5rem; white-space: pre-wrap; font-size: 0.8rem; }
details { margin: 0.5rem 0; }
nav { margin: 0.5rem 0 1rem; } nav a { color: #1f4e9c; }
"""


@dataclasses.dataclass(frozen=True)
class Page:
    """What the page shows; paths are absolute and made relative to the run folder when written."""

    run: RunData
    rows: list[SummaryRow]
    plots: list[PlotFile]
    plot_dir: Path
    media: RunMedia
    thumbnails: dict[Path, Path]
    """Sampled image -> the copy shown for it, shrunk or enlarged (images of about the shown size are shown as they
    are)."""
    window: int
    window_given: bool
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the report adds to the run's notes, one line each: figures left out, recorded episodes dropped."""


def fmt(value: float | int | None, spec: str = ".4g") -> str:
    """A number for the page, or ``n/a`` when there is none (None, NaN or infinite)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def render(page: Page) -> str:
    run = page.run
    title = f"{run.name}" + (f" ({run.env_id})" if run.env_id else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>plugrl report: {_e(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(_subtitle(page))}</p>',
        _nav(page),
        _notes([*run.notes, *page.notes]),
        "<h2 id=\"summary\">Summary</h2>",
        _summary_table(page.rows),
        _segments(run),
        _config(run),
        *_plot_sections(page),
        _instructions(run),
        _samples(page),
        _videos(page),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _href(path: Path, root: Path) -> str:
    """A link from the page (in ``root``) to ``path``, URL-quoted."""
    return quote(path.relative_to(root).as_posix())


def _subtitle(page: Page) -> str:
    run = page.run
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    procs = len(run.processes)
    how = "--window" if page.window_given else "default: about 5% of the episodes"
    return (f"{len(run.pooled)} episodes from {procs} process{'es' if procs != 1 else ''}; moving averages over "
            f"{page.window} episodes ({how}); report written {stamp} from {run.root}")


def _nav(page: Page) -> str:
    """Links to the sections the page has."""
    have = [("summary", "Summary")]
    have += [(key, heading) for key, heading in SECTIONS if any(p.section == key for p in page.plots)]
    if any(i is not None for i in page.run.pooled.instructions):
        have.append(("instructions", "Instructions"))
    if page.media.samples:
        have.append(("samples", "Sampled observations"))
    if page.media.videos:
        have.append(("videos", "Videos"))
    return "<nav>" + " | ".join(f'<a href="#{key}">{heading}</a>' for key, heading in have) + "</nav>"


def _notes(notes: list[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{_e(n)}</li>" for n in notes)
    return f'<div class="notes"><strong>Notes</strong><ul>{items}</ul></div>'


def _summary_table(rows: list[SummaryRow]) -> str:
    head = ("<tr><th></th><th>status</th><th>episodes</th><th>mean return</th><th>success rate</th>"
            "<th>env-steps/s</th></tr>")
    body = "".join(
        f"<tr><td>{_e(r.label)}</td><td class=\"text\">{_e(r.status)}</td><td>{r.episodes}</td>"
        f"<td>{fmt(r.mean_return, '.4f')}</td><td>{fmt(r.success_rate, '.3f')}</td>"
        f"<td>{fmt(r.env_steps_per_s, ',.0f')}</td></tr>"
        for r in rows
    )
    return (f"<table>{head}{body}</table><p class=\"sub\">Means over every episode; env-steps/s over each process's "
            "collection time (for all: the total over the longest).</p>")


def _segments(run: RunData) -> str:
    """When and how each segment of the run ran (a run resumed with --resume has several), from summary.json."""
    segments = run.segments
    if not segments:
        return ""
    rows = "".join(
        f"<tr><td>{_e(s.get('segment'))}</td><td class=\"text\">{_e(s.get('started') or 'unknown')}</td>"
        f"<td class=\"text\">{_e(s.get('ended') or 'unknown')}</td><td class=\"text\">{_e(s.get('status'))}</td>"
        f"<td>{_e(s.get('episodes'))}</td></tr>" for s in segments)
    count = len(segments)
    said = "1 segment (never resumed)" if count == 1 else (
        f"{count} segments (resumed {'once' if count == 2 else f'{count - 1} times'} with --resume)")
    return (f"<p>The run ran in {_e(said)}:</p><table><tr><th>segment</th><th>started (UTC)</th><th>ended (UTC)</th>"
            f"<th>status</th><th>episodes</th></tr>{rows}</table>")


def _config(run: RunData) -> str:
    if run.config is None:
        return "<p>No client_config.json in the run folder.</p>"
    shown = [(k, run.config[k]) for k in CONFIG_KEYS if run.config.get(k) is not None]
    server = server_url(run.config)
    if server is not None:
        shown.append(("server", server))
    cells = "".join(f"<tr><td>{_e(k)}</td><td class=\"text\">{_e(finite_json(v))}</td></tr>" for k, v in shown)
    full = json.dumps(finite_json(run.config), indent=2, sort_keys=True, default=str)
    return (f"<table>{cells}</table><details><summary>every flag of the run (client_config.json)</summary>"
            f"<pre>{_e(full)}</pre></details>")


def server_url(config: dict) -> str | None:
    """The URL of the server the run used: ``server_url`` (the client writes the embedded server's there once it
    is up), else the one ``server_host`` and ``server_port`` make. A ``--local-policy`` run of a client that
    recorded only the flags' defaults has no such URL (its embedded server took a free port)."""
    if config.get("server_url"):
        return str(config["server_url"])
    if config.get("local_policy"):
        return "the embedded server (its port was not recorded)"
    host, port = config.get("server_host"), config.get("server_port")
    return f"ws://{host}:{port}" if host and port else None


def _plot_sections(page: Page) -> list[str]:
    out: list[str] = []
    root = page.run.root
    if not len(page.run.pooled):
        out.append(f'<h2 id="episodes">Episodes</h2><p>{_no_episodes(page.run)}</p>')
    for key, heading in SECTIONS:
        plots = [p for p in page.plots if p.section == key]
        if not plots:
            continue
        figures = "".join(
            f'<figure class="plot"><a href="{_href(page.plot_dir / p.name, root)}">'
            f'<img src="{_href(page.plot_dir / p.name, root)}" alt="{_e(p.title)}"></a>'
            f"<figcaption><strong>{_e(p.title)}</strong>. {_e(p.caption)}</figcaption></figure>"
            for p in plots
        )
        out.append(f'<h2 id="{key}">{heading}</h2><div class="grid">{figures}</div>')
    run = page.run
    if len(run.pooled) and not run.success_defined:
        out.append("<p>Success rate: n/a (the env reports no success).</p>")
    return out


ENDED = {s.value for s in ProcessStatus if s.ended} | {"mixed"}
"""Statuses of a summary whose run will write no more episodes (``mixed``: processes that ended differently)."""


def _no_episodes(run: RunData) -> str:
    """Why there is nothing to plot: the run is still going (wait), or it ended without an episode (what happened,
    and where its log is)."""
    ended = _how_it_ended(run)
    if ended is None:
        return ("No episode has finished in this run yet, so there is nothing to plot. Run the report again once "
                "episodes are written to rollout/proc_NNN/episodes.jsonl.")
    status, errors = ended
    what = {"failed": "The run failed", "interrupted": "The run was interrupted"}.get(status, f"The run ended ({status})")
    text = _e(f"{what} before any episode finished, so there is nothing to plot.")
    if errors:
        shown = "; ".join(errors[:MAX_ERRORS]) + (f"; and {len(errors) - MAX_ERRORS} more" if len(errors) > MAX_ERRORS
                                                 else "")
        text += " " + _e(f"{'Its error' if len(errors) == 1 else 'Its errors'} (summary.json): {shown}.")
    log = RunDir(run.root).log_file
    if log.is_file():
        text += f' Its log: <a href="{_href(log, run.root)}">{_e(log.relative_to(run.root).as_posix())}</a>.'
    else:
        text += _e(f" It left no log at {log.relative_to(run.root).as_posix()}.")
    return text


def _how_it_ended(run: RunData) -> tuple[str, list[str]] | None:
    """The run's status and its errors (``process N: message``) when its summaries say it ended, else None: the
    aggregate summary's, or, without one, the processes' when every process has one."""
    if run.summary is not None:
        status = str(run.summary.get("status"))
        raw = run.summary.get("errors")
        errors = [f"process {pid}: {message}" for pid, message in raw.items() if message] if isinstance(raw, dict) else []
    else:
        summaries = [(p.process_id, p.summary) for p in run.processes if p.summary is not None]
        if not summaries or len(summaries) < len(run.processes):
            return None
        statuses = {str(s.get("status")) for _, s in summaries}
        status = "failed" if "failed" in statuses else statuses.pop() if len(statuses) == 1 else "mixed"
        errors = [f"process {pid}: {s['error']}" for pid, s in summaries if s.get("error")]
    return (status, errors) if status in ENDED else None


def _instructions(run: RunData) -> str:
    rows, distinct = instruction_rows(run.pooled, run.success_defined, MAX_INSTRUCTIONS)
    if not rows:
        return ""
    body = "".join(
        f'<tr><td class="text">{_e(_clip(r.instruction, 160))}</td><td>{r.episodes}</td>'
        f"<td>{fmt(r.mean_return, '.4f')}</td><td>{fmt(r.success_rate, '.3f')}</td></tr>"
        for r in rows
    )
    more = f" (the {len(rows)} most frequent of {distinct})" if distinct > len(rows) else ""
    return (f"<h2 id=\"instructions\">Instructions</h2><p>Episodes per instruction{more}.</p><table><tr>"
            f"<th>instruction</th><th>episodes</th><th>mean return</th><th>success rate</th></tr>{body}</table>")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _samples(page: Page) -> str:
    samples = page.media.samples
    if not samples:
        return ""
    root = page.run.root
    out = ['<h2 id="samples">Sampled observations</h2>']
    for pid in sorted({s.process_id for s in samples}):
        mine = [s for s in samples if s.process_id == pid]
        images = [s for s in mine if s.kind == "png"]
        others = [s for s in mine if s.kind != "png"]
        out.append(f"<h3>process {pid}</h3>")
        if images:
            figures = "".join(_frame(s, page.thumbnails.get(s.path, s.path), root)
                              for s in images[:MAX_IMAGES_PER_PROCESS])
            out.append(f'<div class="grid">{figures}</div>')
            out.append(_more(len(images), MAX_IMAGES_PER_PROCESS, "images", images[0].path.parent, root))
        if others:
            items = "".join(f"<tr><td class=\"text\"><a href=\"{_href(s.path, root)}\">{_e(s.label)}</a></td>"
                            f"<td class=\"text\"><pre>{_e(_sample_text(s))}</pre></td></tr>"
                            for s in others[:MAX_OTHER_SAMPLES_PER_PROCESS])
            out.append(f"<table><tr><th>sample</th><th>content</th></tr>{items}</table>")
            out.append(_more(len(others), MAX_OTHER_SAMPLES_PER_PROCESS, "states and texts", others[0].path.parent, root))
    return "\n".join(o for o in out if o)


def _frame(sample: Sample, shown: Path, root: Path) -> str:
    return (f'<figure class="frame"><a href="{_href(sample.path, root)}"><img src="{_href(shown, root)}" '
            f'alt="{_e(sample.label)}" loading="lazy"></a><figcaption>{_e(sample.label)}</figcaption></figure>')


def _sample_text(sample: Sample) -> str:
    return describe_state(sample.path) if sample.kind == "npy" else text_preview(sample.path)


def _more(count: int, limit: int, what: str, folder: Path, root: Path) -> str:
    if count <= limit:
        return ""
    return (f'<p>{count - limit} more {what} not shown: see <a href="{_href(folder, root)}/">'
            f"{_e(folder.relative_to(root).as_posix())}/</a>.</p>")


def _videos(page: Page) -> str:
    videos = page.media.videos
    if not videos:
        return ""
    root = page.run.root
    out = ['<h2 id="videos">Videos</h2>']
    for pid in sorted({v.process_id for v in videos}):
        mine = [v for v in videos if v.process_id == pid]
        figures = "".join(
            f'<figure class="video"><video controls preload="metadata" src="{_href(v.path, root)}"></video>'
            f'<figcaption><a href="{_href(v.path, root)}">{_e(v.path.name)}</a></figcaption></figure>'
            for v in mine[:MAX_VIDEOS_PER_PROCESS]
        )
        out.append(f'<h3>process {pid}</h3><div class="grid">{figures}</div>')
        out.append(_more(len(mine), MAX_VIDEOS_PER_PROCESS, "videos", mine[0].path.parent, root))
    return "\n".join(o for o in out if o)


def render_suite(suite: dict, root: Path, plots: list[PlotFile], plot_dir: Path, notes: list[str]) -> str:
    """The page of a suite's folder (``suite.json``): its table, a bar chart per quantity with a bar per task, and
    a link to each task's run folder (``plugrl-report <suite>/<run>`` reports a task alone)."""
    tasks = [t for t in suite.get("tasks", []) if isinstance(t, dict)]
    head = ("<tr><th>task</th><th>env</th><th>episodes</th><th>mean return</th><th>success rate</th>"
            "<th>mean length</th><th>status</th><th>run folder</th></tr>")

    def run_link(task: dict) -> str:
        run = task.get("run")
        if not isinstance(run, str) or not (root / run).is_dir():
            return ""
        page = root / run / "report.html"
        target = page if page.exists() else root / run
        return f'<a href="{_href(target, root)}">{_e(run)}</a>'

    body = "".join(
        f"<tr><td>{_e(t.get('name'))}</td><td class=\"text\">{_e(t.get('env'))}</td><td>{fmt(t.get('episodes'))}</td>"
        f"<td>{fmt(t.get('mean_return'), '.4f')}</td><td>{fmt(t.get('success_rate'), '.3f')}</td>"
        f"<td>{fmt(t.get('mean_length'), '.1f')}</td><td class=\"text\">{_e(t.get('status'))}</td>"
        f"<td class=\"text\">{run_link(t)}</td></tr>"
        for t in tasks
    )
    mean = (f"<tr><th>mean</th><td></td><td>{sum(t.get('episodes') or 0 for t in tasks)}</td>"
            f"<td>{fmt(suite.get('mean_return'), '.4f')}</td><td>{fmt(suite.get('success_rate'), '.3f')}</td>"
            f"<td>{fmt(suite.get('mean_length'), '.1f')}</td><td></td><td></td></tr>")
    figures = "".join(
        f'<figure class="plot"><a href="{_href(plot_dir / p.name, root)}">'
        f'<img src="{_href(plot_dir / p.name, root)}" alt="{_e(p.title)}"></a>'
        f"<figcaption><strong>{_e(p.title)}</strong>. {_e(p.caption)}</figcaption></figure>"
        for p in plots
    )
    name = str(suite.get("name", root.name))
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    done = suite.get("tasks_done", "?")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>plugrl suite report: {_e(name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>suite {_e(name)}</h1>",
        f'<p class="sub">{_e(done)} of {len(tasks)} tasks done; report written {_e(stamp)} from {_e(root)}</p>',
        _notes(notes),
        '<h2 id="tasks">Tasks</h2>',
        f"<table>{head}{body}{mean}</table>",
        '<p class="sub">Each task\'s means are over all its episodes; the suite\'s are the means of its tasks\' '
        "(success rate: of the tasks with a success rule). A task's own report: plugrl-report on its run folder.</p>",
        f'<h2 id="bars">Per task</h2><div class="grid">{figures}</div>' if figures else "",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
