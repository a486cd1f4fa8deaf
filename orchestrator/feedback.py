"""Feedback on work that takes more than a few seconds (the planner's search, the reliability
check, a run's steps): what is being done and how far it is.

On a terminal a rich bar; off one (CI logs, ``| tee``, a file) a plain line
``"<description>: k/N (p%) <note>"`` each time the work crosses another 10 % or 30 s have passed
since the last line, so that a log never sits silent for minutes and never floods either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: Off a terminal, a line each time progress crosses another 1/LINE_PARTS of the total (10 %) ...
LINE_PARTS = 10
#: ... or when this many seconds have passed since the last line.
LINE_EVERY_S = 30.0


def plural(n: int, noun: str) -> str:
    """``"1 configuration"``, ``"40 configurations"``: a description reads right for any N."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def progress_line(description: str, done: int, total: int, note: str | None = None) -> str:
    """The plain line off a terminal: ``"simulating 40 configurations: 12/40 (30%) 8× t4"``."""
    pct = f" ({100 * done // total}%)" if total > 0 else ""
    return f"{description}: {done}/{total}{pct}" + (f" {note}" if note else "")


class LinePacer:
    """When the next plain line is due: progress crossed another 1/``LINE_PARTS`` of
    ``total``, or ``LINE_EVERY_S`` seconds passed since the last line. ``clock`` is injected so
    that a test drives it without sleeping."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.clock = total, clock
        self.last_s = clock()
        self.last_tenth = 0

    def due(self, done: int) -> bool:
        """Whether a line is due at ``done`` (of ``total``); if so, counts it as printed."""
        now = self.clock()
        tenth = done * LINE_PARTS // self.total if self.total > 0 else 0  # exact: no float
        if tenth > self.last_tenth or now - self.last_s >= LINE_EVERY_S:
            self.last_tenth, self.last_s = max(tenth, self.last_tenth), now
            return True
        return False


class Feedback:
    """``with Feedback("simulating 40 configurations", 40) as fb: ... fb.advance(note=label)``.

    A bar on a terminal (kept after the work, with its elapsed time); off a terminal a start
    line, a line per :class:`LinePacer`, and a final line with the elapsed time (or where it
    stopped, on an exception); nothing at all for no work. ``console`` None: our stderr console
    (``make_console``), so that stdout stays the command's answer (the planner's table, the
    reliability check's markdown). The bar refreshes on ``advance`` only, with no thread of its own, so that the planner's
    worker processes fork from a process holding no lock of rich's."""

    def __init__(self, description: str, total: int, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if console is None:
            from orchestrator.display import make_console

            console = make_console(stderr=True)
        self.description, self.total, self.console, self.clock = (
            description, total, console, clock)
        self.done = 0
        self.started = 0.0
        self._pacer: LinePacer | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Feedback:
        self.started = self.clock()
        self._pacer = LinePacer(self.total, self.clock)
        if self.total <= 0:  # nothing to do, nothing to say (the caller says why)
            return self
        if self.console.is_terminal:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[note]}", markup=False),
                console=self.console, auto_refresh=False, transient=False)
            self._progress.start()
            self._task = self._progress.add_task(escape(self.description), total=self.total,
                                                 note="")
            self._progress.refresh()
        else:
            self._line(progress_line(self.description, 0, self.total, "started"))
        return self

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more units done; ``note``: what was just done (a candidate's label)."""
        self.done += n
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, note=note or "")
            self._progress.refresh()
        elif (self._pacer is not None and self.done < self.total  # the end has its own line
              and self._pacer.due(self.done)):
            self._line(progress_line(self.description, self.done, self.total, note))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
            return
        if self.total <= 0:
            return
        took = f"{self.clock() - self.started:.0f} s"
        end = f"stopped after {took}" if exc_type is not None else f"done in {took}"
        self._line(progress_line(self.description, self.done, self.total, end))

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)
