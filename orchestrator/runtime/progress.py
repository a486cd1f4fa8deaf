"""Progress display: a bar of global steps per run with steps/s, loss and latest accuracy.

Quiet when stdout is not a terminal (CI logs, pipes): then only a one-line start and end.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RunProgress:
    """Context manager around rich.Progress for one run."""

    def __init__(self, title: str, total_steps: int, enabled: bool = True,
                 console: Console | None = None) -> None:
        if console is None:
            from orchestrator.display import make_console

            console = make_console()
        self.console = console
        self.enabled = enabled and self.console.is_terminal
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
            self._task = self._progress.add_task(self.title, total=self.total, **self._fields)
        else:
            self.console.print(f"{self.title}: started ({self.total} global steps)",
                               highlight=False)
        return self

    def status(self, text: str) -> None:
        """A phase of the run outside training (provisioning, starting roles, teardown)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self.title} [{text}]")

    def update(self, step: int | None = None, steps_per_sec: float | None = None,
               loss: float | None = None, accuracy: float | None = None) -> None:
        if steps_per_sec is not None:
            self._fields["sps"] = f"{steps_per_sec:.1f}"
        if loss is not None:
            self._fields["loss"] = f"{loss:.4f}"
        if accuracy is not None:
            self._fields["acc"] = f"{accuracy:.4f}"
        if self._progress is not None and self._task is not None:
            kwargs = {"completed": min(step, self.total)} if step is not None else {}
            self._progress.update(self._task, description=self.title, **kwargs, **self._fields)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
