"""One detached sweep as the user's machine sees it: found by id or URL, its bucket, its
controller's state and cost, and its points' status, read from the sweep's objects in the
bucket (``layout``). The commands of ``python -m orchestrator.controller`` act on it."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.controller import index, layout

#: The files of a point folder that ``status`` reads (a finished point: its summary suffices).
_STATUS_FILES = ("summary.json", "config.yaml", ".hydra/overrides.yaml")
_LIVE_FILES = ("events.jsonl", "plan.json", "trainer_spec.json")


class BadSweep(Exception):
    """SWEEP names no detached sweep (exit 2, one line)."""


class Failed(Exception):
    """The command could not do its work (exit 1, one line)."""


# --- the sweep in the bucket -----------------------------------------------------------------


@dataclass
class Sweep:
    """One detached sweep as this machine sees it: its URLs, the folder it was submitted from
    (None on another machine), the storage client acting as its provider section, and its
    command."""

    urls: layout.SweepUrls
    cwd: Path | None
    store: Any  # GcsStore
    command: layout.Command
    credentials: str | None = None

    def url(self, *parts: str) -> Any:  # -> GcsUrl
        from provisioning.gce.storage import GcsUrl

        return GcsUrl.parse(self.urls.child(*parts))

    def state(self) -> layout.ControllerState | None:
        from orchestrator.controller.resume import read_state

        return read_state(self.store, self.urls)

    def write_state(self, state: layout.ControllerState) -> None:
        self.store.write_bytes(self.url(layout.STATE_FILE), state.to_json().encode())

    def console(self, start: int = 0) -> bytes:
        return self.store.read_bytes(self.url(layout.CONSOLE_FILE), start) or b""

    def gce_config(self) -> Any:  # -> GceConfig
        from dataclasses import replace

        cfg = self.command.gce_config()
        return replace(cfg, credentials=self.credentials) if self.credentials else cfg

    @property
    def pull_dir(self) -> Path:
        """Where an attached sweep would have written its folder: the submitting command's
        folder (this machine's record), else the current one, and the sweep folder in it."""
        return (self.cwd if self.cwd is not None and self.cwd.is_dir() else Path.cwd()) \
            / self.command.sweep_dir


def resolve(text: str) -> tuple[layout.SweepUrls, Path | None]:
    """SWEEP -> its URLs and, for a sweep submitted here, the folder it was submitted from."""
    if text.startswith("gs://"):
        try:
            urls = layout.SweepUrls.parse(text)
        except ValueError as error:
            raise BadSweep(str(error)) from None
        found = index.lookup(urls.sweep_id)
        return urls, found[1] if found and found[0].root == urls.root else None
    problem = layout.sweep_id_problem(text)
    if problem:
        raise BadSweep(f"{problem}; give the sweep's id or its gs://BUCKET/PREFIX/"
                       f"{layout.SWEEPS}/SWEEP_ID URL")
    found = index.lookup(text)
    if found is None:
        raise BadSweep(f"no sweep {text} was submitted from this machine ({index.index_dir()}"
                       f" has no record of it); give its gs://BUCKET/PREFIX/{layout.SWEEPS}/"
                       f"{text} URL")
    return found


def open_sweep(text: str, credentials: str | None = None) -> Sweep:
    """Find the sweep and read its command (BadSweep when there is none under the URL)."""
    from orchestrator.controller.resume import ResumeRefused, read_command
    from provisioning.gce.storage import store_for_provider

    urls, cwd = resolve(text)
    identity = {"credentials": credentials} if credentials else {}
    try:
        command = read_command(store_for_provider(identity), urls)
    except ResumeRefused:
        raise BadSweep(f"{urls.root} holds no detached sweep ({layout.SUBMIT}/"
                       f"{layout.COMMAND_FILE} is missing)") from None
    store = store_for_provider({**command.provider, **identity})
    return Sweep(urls, cwd, store, command, credentials)


def stale(state: layout.ControllerState | None, now: float | None = None) -> bool:
    """A controller that should be heartbeating and is not (never for a finished one)."""
    from orchestrator.controller.resume import STALE_S

    return state is not None and not state.terminal and state.age_s(now) > STALE_S


def phase_text(state: layout.ControllerState | None, now: float | None = None) -> str:
    """The controller's phase as the user reads it."""
    if state is None:
        return "unknown (no controller.json)"
    age = state.age_s(now)
    if state.terminal:
        code = "" if state.exit_code is None else f", exit code {state.exit_code}"
        return f"{state.phase}{code}"
    if state.phase in (layout.RUNNING, layout.CANCELLING) and stale(state, now):
        return f"unresponsive (last heard {age:.0f} s ago)"
    return f"{state.phase} (heard {age:.0f} s ago)"


def controller_cost(sweep: Sweep, state: layout.ControllerState | None,
                    now: float | None = None) -> float:
    """The controller VM's cost so far: its hourly price from its start until now (or its
    last word, once it has ended)."""
    from provisioning import catalog

    if state is None or state.started is None:
        return 0.0
    end = state.updated if state.terminal or stale(state, now) else (now or time.time())
    return catalog.cost_usd([sweep.command.controller_usd_per_hour],
                            max(0.0, end - state.started))


# --- status ----------------------------------------------------------------------------------


@dataclass
class PointStatus:
    """One point of the sweep as ``status`` shows it."""

    num: int
    overrides: list[str] = field(default_factory=list)
    status: str = "not started"
    protocol: str = ""
    step: int | None = None
    target: int | None = None
    revocations: int | None = None
    cost_usd: float | None = None


def sweep_points(command: layout.Command) -> list[list[str]]:
    """Each point's overrides as the sweep expands them ([] when it cannot be expanded
    here: the folders in the bucket are then all there is to show)."""
    from orchestrator.sweep import expand_sweep

    try:
        return expand_sweep([o for o in command.overrides if not o.startswith("-")])
    except Exception:  # a glob of the user's groups, a parser of another version
        return []


def point_statuses(sweep: Sweep, state: layout.ControllerState | None) -> list[PointStatus]:
    """Every point: its folder in the mirror folded as a run's record is (``summary.json``
    once it has ended; its events, plan and spec while it runs, :func:`record.killed_summary`
    giving the cost so far), and the points with no folder yet from the sweep's expansion."""
    from orchestrator.rundir import record, results
    from orchestrator.rundir.index import recorded_overrides

    names = sweep.store.list(sweep.url(layout.MIRROR))
    folders: dict[int, set[str]] = {}
    for name in names:
        head, _, rest = name.partition("/")
        if head.isdigit() and rest:
            folders.setdefault(int(head), set()).add(rest)
    wanted = []
    for num, files in folders.items():
        pick = _STATUS_FILES if "summary.json" in files else (*_STATUS_FILES, *_LIVE_FILES)
        wanted += [f"{num}/{f}" for f in pick if f in files]
    expanded = sweep_points(sweep.command)
    common = set.intersection(*(set(p) for p in expanded)) if len(expanded) > 1 else set()
    running = state is not None and not state.terminal and not stale(state)
    points = []
    with tempfile.TemporaryDirectory(prefix="transient-status-") as tmp:
        sweep.store.download(sweep.url(layout.MIRROR), Path(tmp), wanted)
        for num in sorted(set(folders) | set(range(len(expanded)))):
            run_dir = Path(tmp) / str(num)
            overrides = recorded_overrides(run_dir) or \
                (expanded[num] if num < len(expanded) else [])
            point = PointStatus(num, [o for o in overrides if o not in common])
            points.append(point)
            if num not in folders:
                continue
            point.target = _train_steps(run_dir / results.CONFIG_FILE)
            summary = results.read_summary(run_dir)
            if summary is not None:
                point.status = str(summary.get("status"))
                point.step = summary.get("global_steps")
                point.protocol = str(summary.get("protocol") or "")
                point.revocations = summary.get("revocations")
                point.cost_usd = summary.get("cost_usd")
                continue
            if not (run_dir / results.EVENTS_FILE).exists():
                point.status = "starting"
                continue
            state_of_run = record.fold_events_file(run_dir / results.EVENTS_FILE)
            so_far = record.killed_summary(run_dir)
            point.status = results.STATUS_RUNNING if running else "no summary (controller " \
                "not running)"
            point.step = state_of_run.global_step
            point.protocol = state_of_run.protocol or so_far.protocol or ""
            point.revocations = state_of_run.revocations
            point.cost_usd = so_far.cost_usd
    return points


def _train_steps(config_yaml: Path) -> int | None:
    import yaml

    try:
        job = (yaml.safe_load(config_yaml.read_text()) or {}).get("job") or {}
        return int(job["train_steps"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError):
        return None
