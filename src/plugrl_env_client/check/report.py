"""The checker's results and how they read: one :class:`CheckResult` per rule, gathered in a :class:`CheckReport`
that renders as a checklist, in plain text for logs and pipes, in colour (rich) for a terminal."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import IO, TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.text import Text

Status = Literal["pass", "warn", "fail", "skip"]
"""A rule passed, warned (the client copes, but something is probably unintended), failed (a run would stop, or
would be wrong) or was skipped (something it needs is broken)."""

_STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
_INDENT = " " * 11


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one rule: ``seen`` says what was observed (for a skip: why it did not run), ``fix`` what to
    change. A passing rule may carry a note in ``seen``."""

    rule: str
    status: Status
    seen: str = ""
    fix: str = ""
    number: int = 0
    details: str = ""
    """The traceback of an exception the env raised, for logs (not shown in the checklist by default)."""


@dataclasses.dataclass
class CheckReport:
    """Every rule's :class:`CheckResult`, in order; renders as a checklist (plain text or, with rich, in colour)."""

    subject: str
    results: list[CheckResult] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No rule failed (warnings and skips do not count)."""
        return not any(r.status == "fail" for r in self.results)

    def result(self, number: int) -> CheckResult:
        """The result of rule ``number`` (1-based, as printed)."""
        for r in self.results:
            if r.number == number:
                return r
        raise KeyError(f"no rule {number} in this report")

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        verdict = "OK" if self.ok else "FAILED"
        return (f"{c['pass']} passed, {c['warn']} warning{'' if c['warn'] == 1 else 's'}, {c['fail']} failed, "
                f"{c['skip']} skipped: {verdict}")

    def lines(self, details: bool = False) -> list[tuple[Status | None, str]]:
        """The checklist as (status, line) pairs; ``status`` is None for lines that belong to the rule above."""
        out: list[tuple[Status | None, str]] = [(None, f"check {self.subject}")]
        for r in self.results:
            out.append((r.status, f"[{_STATUS_MARK[r.status]}] {r.number:>2}. {r.rule}"))
            label = {"pass": "note", "skip": "why"}.get(r.status, "seen")
            for name, text in ((label, r.seen), ("fix", r.fix)):
                if text:
                    out.extend((None, line) for line in _wrap(f"{name}:", text))
            if details and r.details:
                out.extend((None, _INDENT + line) for line in r.details.rstrip().splitlines())
        out.append((None, f"{self.subject}: {self.summary()}"))
        return out

    def render(self, details: bool = False) -> str:
        """Plain text, one line per rule, for terminals without colour and for log files."""
        return "\n".join(line for _, line in self.lines(details))

    def __str__(self) -> str:
        return self.render()

    def to_rich(self, details: bool = False) -> Text:
        """The same checklist as a rich ``Text`` with the marks coloured by status."""
        from rich.text import Text

        text = Text()
        for i, (status, line) in enumerate(self.lines(details)):
            if i:
                text.append("\n")
            if status is None:
                text.append(line, style="bold" if i == 0 else None)
            else:
                mark_end = line.index("]") + 1
                text.append(line[:mark_end], style=_STATUS_STYLE[status])
                text.append(line[mark_end:])
        return text

    def print(self, file: IO[str] | None = None, color: bool | None = None, details: bool = False) -> None:
        """Print to ``file`` (stdout); in colour when ``color`` is True, or by default when ``file`` is a terminal."""
        file = file if file is not None else sys.stdout
        if color is None:
            color = bool(getattr(file, "isatty", lambda: False)())
        if color:
            from rich.console import Console

            Console(file=file, force_terminal=True, highlight=False, soft_wrap=True).print(self.to_rich(details))
        else:
            print(self.render(details), file=file)


def _wrap(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, width=116, initial_indent=f"{_INDENT}{label:<6}", subsequent_indent=_INDENT + " " * 6,
                         break_long_words=False, break_on_hyphens=False) or [f"{_INDENT}{label}"]
