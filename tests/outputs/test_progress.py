"""Progress lines, the periodic non-terminal output, the terminal redraw, and the final summary table."""

from __future__ import annotations

import io
import re
import time

from waiting import threads_started_by, wait_until

from plugrl_env_client.outputs.progress import Progress, summary_table
from plugrl_env_client.rollout.budget import EpisodeBudget


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_line_with_a_target_shows_a_bar_and_the_count() -> None:
    budget = EpisodeBudget(10)
    for _ in range(3):
        budget.claim()
    budget.add_env_steps(50)
    line = Progress(budget, io.StringIO(), period=60).line()
    assert re.fullmatch(r"\[#{7}-{17}\] 3/10 episodes \| [\d,]+ env-steps/s \| [\d,]+s", line), line


def test_line_bar_is_full_at_the_target() -> None:
    budget = EpisodeBudget(4)
    while budget.claim():
        pass
    assert Progress(budget, io.StringIO(), period=60).line().startswith("[" + "#" * 24 + "] 4/4 episodes")


def test_line_without_a_target_counts_episodes_only() -> None:
    budget = EpisodeBudget(None)
    budget.claim()
    budget.claim()
    line = Progress(budget, io.StringIO(), period=60).line()
    assert re.fullmatch(r"2 episodes \| [\d,]+ env-steps/s \| [\d,]+s", line), line
    assert "[" not in line


def test_rate_reflects_env_steps() -> None:
    budget = EpisodeBudget(None)
    progress = Progress(budget, io.StringIO(), period=60)
    budget.add_env_steps(10**9)
    rate = int(re.search(r"\| ([\d,]+) env-steps/s", progress.line()).group(1).replace(",", ""))
    assert rate > 10**6


def test_non_tty_stream_gets_progress_lines_until_stopped() -> None:
    budget = EpisodeBudget(5)
    stream = io.StringIO()
    progress = Progress(budget, stream, period=0.01)
    assert progress.tty is False
    ticking = threads_started_by(progress.start)
    budget.claim()
    wait_until(lambda: stream.getvalue().count("\n") >= 3, 5, "three progress lines")
    progress.stop()
    text = stream.getvalue()
    lines = text.splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("progress: [") for line in lines), lines
    assert "\r" not in text
    assert ticking and not any(t.is_alive() for t in ticking), "stop() ended the thread: nothing is written after it"
    assert stream.getvalue() == text


def test_tty_stream_redraws_one_line_and_ends_it_on_stop() -> None:
    budget = EpisodeBudget(None)
    stream = _Tty()
    progress = Progress(budget, stream, period=60)
    assert progress.tty is True
    assert progress.period == 60
    progress.start()
    progress.stop()
    text = stream.getvalue()
    assert text.startswith("\r0 episodes")
    assert text.endswith("\n") and text.count("\n") == 1


def test_tty_redraw_overwrites_a_longer_previous_line() -> None:
    stream = _Tty()
    progress = Progress(EpisodeBudget(None), stream, period=60)
    lines = iter(["100 episodes | 12,345 env-steps/s | 9s", "101 episodes | 9 env-steps/s | 10s"])
    progress.line = lambda: next(lines)  # type: ignore[method-assign]
    progress._draw()
    progress._draw(final=True)
    first, second = stream.getvalue().split("\r")[1:]
    assert second.rstrip("\n").rstrip() == "101 episodes | 9 env-steps/s | 10s"
    assert len(second.rstrip("\n")) >= len(first)


def test_default_periods() -> None:
    assert Progress(EpisodeBudget(None), io.StringIO()).period == 10.0
    assert Progress(EpisodeBudget(None), _Tty()).period == 0.5


def test_summary_table_contains_the_key_rows() -> None:
    summary = {
        "status": "finished",
        "completed_episodes": 12,
        "mean_return": 99.0,  # over the latest episodes only: the table shows the means over every episode
        "all_episodes": {"mean_return": 1.23456, "mean_length": 42.04, "mean_success_rate": 0.5},
        "timing": {"env_steps": 5000, "effective_fps": 12345.6, "infer_calls": 77, "infer_wait_s": 0.5},
    }
    rows = {line.strip().rsplit("  ", 1)[0].strip(): line.strip().rsplit("  ", 1)[1].strip()
            for line in summary_table(summary).splitlines()}
    assert rows == {
        "status": "finished",
        "episodes": "12",
        "mean return": "1.2346",
        "mean length": "42.0",
        "success rate": "0.500",
        "env steps": "5000",
        "env-steps/s": "12,346",
        "infer calls": "77",
        "infer wait s": "0.500",
    }


def test_summary_table_shows_na_for_missing_means() -> None:
    table = summary_table({"status": "stopped by server", "completed_episodes": 0, "timing": {},
                           "all_episodes": {"mean_return": None, "mean_length": None, "mean_success_rate": None}})
    lines = {line.split()[0] + (" " + line.split()[1] if line.split()[0] in ("mean", "success") else ""): line
             for line in table.splitlines()}
    assert lines["mean return"].endswith("n/a")
    assert lines["mean length"].endswith("n/a")
    assert lines["success rate"].endswith("n/a")
    assert "stopped by server" in table


def test_periodic_calls_until_stopped() -> None:
    from plugrl_env_client.outputs.progress import Periodic

    calls: list[float] = []
    ticker = Periodic(0.01, lambda: calls.append(time.monotonic()))
    ticking = threads_started_by(ticker.start)
    wait_until(lambda: len(calls) >= 3, 5, "three calls")
    ticker.stop()
    assert ticking and not any(t.is_alive() for t in ticking), "stop() ended the thread: no call after it"
    assert len(calls) >= 3
