"""Progress display: a bar of global steps per run with steps/s, loss and latest accuracy.

When stdout is not a terminal (CI logs, ``| tee``, a file): plain lines instead, the start, each
start-up phase as it changes (provisioning, starting roles, training), a line at each 10 % of
the global steps or every 30 s of steps (``orchestrator/feedback.py``), a line saying the phase
still runs after 30 s without any (a VM that boots for minutes), and the run's end line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from orchestrator.feedback import LINE_EVERY_S, LinePacer, progress_line

#: Off a terminal, how often the quiet check (:meth:`RunProgress.still`) looks at the clock.
STILL_CHECK_S = 5.0


class RunProgress:
    """Context manager around rich.Progress for one run."""

    def __init__(self, title: str, total_steps: int, enabled: bool = True,
                 console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if console is None:
            from orchestrator.display import make_console

            console = make_console()
        self.console = console
        self.enabled = enabled and self.console.is_terminal
        self.lines = enabled and not self.console.is_terminal  # plain lines off a terminal
        self.clock = clock
        self._pacer: LinePacer | None = None
        self._phase: str | None = None
        self._phase_since = self._last_line_s = clock()
        self._quiet: threading.Event | None = None  # set: the quiet check's thread stops
        self.title = title
        self.total = total_steps
        self._progress: Progress | None = None
        self._task = None
        self._fields = {"sps": "-", "loss": "-", "acc": "-"}

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[sps]} steps/s  loss {task.fields[loss]}  "
                           "acc {task.fields[acc]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(escape(self.title), total=self.total,
                                                 **self._fields)
        else:
            self.console.print(f"{self.title}: started ({self.total} global steps)",
                               highlight=False)
            if self.lines:
                self._pacer = LinePacer(self.total, self.clock)
                self._phase_since = self._last_line_s = self.clock()
            if self.lines and self.clock is time.monotonic:  # a test's clock: it calls still()
                self._quiet = threading.Event()
                threading.Thread(target=self._check_quiet, args=(self._quiet,), daemon=True,
                                 name="run-progress-still").start()
        return self

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)
        self._last_line_s = self.clock()

    def still(self) -> None:
        """Off a terminal: after ``LINE_EVERY_S`` without a line (a VM booting for minutes, a
        restart), a line saying which phase still runs and for how long, so a log never sits
        silent; called every ``STILL_CHECK_S`` by a thread of its own."""
        now = self.clock()
        if self.lines and now - self._last_line_s >= LINE_EVERY_S:
            self._say(f"{self.title}: {self._phase or 'running'}, still "
                      f"({now - self._phase_since:.0f} s)")

    def _check_quiet(self, stop: threading.Event) -> None:
        while not stop.wait(STILL_CHECK_S):
            self.still()

    def status(self, text: str) -> None:
        """A phase of the run outside training (provisioning, starting roles, teardown)."""
        if self._progress is not None and self._task is not None:
            # escaped: rich took "[provisioning]" for a style and showed no phase at all
            self._progress.update(self._task, description=escape(f"{self.title} [{text}]"))
        elif self.lines and text != self._phase:  # a line per change, not per call
            self._say(f"{self.title}: {text}")
        if text != self._phase:
            self._phase_since = self.clock()
        self._phase = text

    def update(self, step: int | None = None, steps_per_sec: float | None = None,
               loss: float | None = None, accuracy: float | None = None) -> None:
        """The chief's latest figures; off a terminal a line when :class:`LinePacer` says so."""
        if steps_per_sec is not None:
            self._fields["sps"] = f"{steps_per_sec:.1f}"
        if loss is not None:
            self._fields["loss"] = f"{loss:.4f}"
        if accuracy is not None:
            self._fields["acc"] = f"{accuracy:.4f}"
        if self._progress is not None and self._task is not None:
            kwargs = {"completed": min(step, self.total)} if step is not None else {}
            self._progress.update(self._task, description=escape(self.title), **kwargs,
                                  **self._fields)
        elif step is not None and self._pacer is not None and self._pacer.due(step):
            said = {"sps": "{} steps/s", "loss": "loss {}", "acc": "acc {}"}
            note = ", ".join(form.format(self._fields[k]) for k, form in said.items()
                             if self._fields[k] != "-")  # only the figures known so far
            self._say(progress_line(self.title, min(step, self.total), self.total,
                                    "global steps" + (f", {note}" if note else "")))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._quiet is not None:
            self._quiet.set()
        if self._progress is not None:
            self._progress.stop()
