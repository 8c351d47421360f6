"""``plugrl-report runs/<exp> [--window K] [--open]``: write a run's report.html and figures, say where they went.

Exit codes, as for every plugrl command (:mod:`plugrl_env_client.cli_support`): 0 when the report was written, 1 on
a user error (a folder that is not a run, a bad ``--window``, matplotlib not installed, a folder the report cannot
be written into) with a one-line message on stderr and no traceback, 2 on a command line the parser refuses. A
figure that cannot be drawn is left out with one ``warning:`` line on stderr naming it; the page is still written
(exit 0).
"""

from __future__ import annotations

import dataclasses
import sys
import webbrowser
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import tyro

from plugrl_env_client.cli_support import cli, exit_code
from plugrl_env_client.errors import ConfigError


@dataclasses.dataclass
class ReportArgs:
    """Plots and a self-contained HTML page (report.html) from a run folder, finished, still going or crashed."""

    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """The run folder plugrl-run-env-client wrote, runs/<exp-name>, or a suite's folder plugrl-run-suite wrote (its
    table and a bar chart per quantity with a bar per task)."""
    window: Annotated[int | None, tyro.conf.arg(
        metavar="K", help_behavior_hint="(default: about 5% of the episodes, at least 5, at most 200)")] = None
    """Episodes in each moving average."""
    open: bool = False
    """Open the report in a web browser when it is written."""


def parse(args: Sequence[str] | None = None) -> ReportArgs:
    return cli(ReportArgs, args, "plugrl-report")


def main(args: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (the console script exits with it)."""
    return exit_code(lambda: _report(parse(args)), args)


def _report(parsed: ReportArgs) -> int:
    from plugrl_env_client.report.build import build_report, build_suite_report, is_suite_folder

    try:
        suite = is_suite_folder(parsed.run)
        report = build_suite_report(parsed.run) if suite else build_report(parsed.run, parsed.window)
    except OSError as exc:  # a read-only run folder, a full disk
        raise ConfigError(f"could not write the report into {parsed.run}: {exc}") from exc
    for skipped in report.skipped:
        print(f"warning: {skipped.message}", file=sys.stderr)
    n = len(report.figures)
    print(f"report: {report.page} ({n} figure{'' if n == 1 else 's'} in {report.page.parent / 'report'})")
    if parsed.open:
        _open(report.page)
    return 0


def _open(page: Path) -> None:
    """Open the page in a browser; without one (a server, CI) say so and carry on."""
    try:
        opened = webbrowser.open(page.resolve().as_uri())
    except webbrowser.Error:
        opened = False
    if not opened:
        print(f"no web browser could be started; open {page} yourself", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
