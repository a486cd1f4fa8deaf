"""``python -m bench``: measure the local stack and write ``docs/benchmarks.md``.

Everything is measured in this one invocation on this machine, and each figure is reported
next to a baseline taken in the same run where one exists. The sections, in the document's
order:

* ``bench/throughput.py``: the local parameter-server cluster (ASP and BSP, 1 and 2 workers)
  against a plain single-process TensorFlow loop; ASP with 1 worker (the goal figure, ≥ 0.95×)
  several times, interleaved with the loop, each run against the two loops around it;
* ``bench/protocols.py``: BSP against ASP with 1 and 2 workers, PROTOCOL_REPEATS rounds, each
  ratio taken within a round, and the in-place BSP→ASP switch's overhead;
* ``bench/startup.py``: command start → first training step over the throughput runs, next
  to one process importing TensorFlow and Keras as the chief does, and where it goes per role;
* ``bench/recovery.py``: worker kill → throughput back, PS kill → training resumed from a
  checkpoint, the in-place BSP→ASP switch, each next to the papers' figures;
* ``bench/dry_runs.py``: dry-run time of every committed experiment;
* the sections of the modules in EXTRA_SECTIONS (each `section() -> list[str]`, measuring when
  called), appended in order; a missing module or a failing section leaves a note instead.

``python -m bench --only startup`` (or ``ps_kill``, ``asp1``, ``protocols``, ``resume``,
``syncswitch``) measures just that piece and prints its markdown instead of writing the
document; ``resume`` (``bench/resume.py``) is ``--resume`` against a cold start,
``syncswitch`` (``bench/syncswitch.py``) the committed Sync-Switch sweep read back by the
analysis layer; both are also EXTRA_SECTIONS, like ``transfer`` (``bench/transfer.py``: the
bytes sent to each host on the SSH test bed, first run, restart and second run) and
``cloud_transfer`` (``bench/cloud_transfer.py``: the headline on the fake cloud with isolated
VMs from the baked image, bytes per VM and restart, RUNNING → first step) and ``planner``
(``bench/planner.py``: the planner's documented question, fast path against the full search).
The local runs share ``bench/runs.py``.

The document is rewritten whole by each run; dated measurements made on their own (A/B pairs,
a piece re-run after a change) and what was learnt from them go to
``docs/benchmark-history.md``, which the benchmark never touches.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

from bench.dry_runs import dry_run_lines, measure_dry_runs
from bench.protocols import measure_protocols, protocol_lines
from bench.recovery import measure_transient, transient_lines
from bench.runs import OUT_DIR, ROOT
from bench.startup import measure_startup_runs, measure_tf_import, startup_lines
from bench.throughput import (
    asp1_lines,
    measure_asp1,
    measure_baseline,
    measure_throughput,
    throughput_lines,
)

DOC = ROOT / "docs" / "benchmarks.md"
EXTRA_SECTIONS = ("bench.resume", "bench.syncswitch", "bench.dispatch", "bench.ssh", "bench.hosts", "bench.sim",
                  "bench.planner",
                  "bench.gce", "bench.gce_real", "bench.transfer", "bench.cloud_transfer")
PIECES = ("startup", "ps_kill", "asp1", "protocols", "resume", "syncswitch", "transfer",
          "cloud_transfer", "planner")


def only(piece: str) -> list[str]:
    """One piece of the benchmark, measured now: its markdown lines."""
    if piece == "startup":
        delays, run_dirs = measure_startup_runs()
        return startup_lines(delays, run_dirs, measure_tf_import())
    if piece == "ps_kill":
        return transient_lines(measure_transient())
    if piece == "asp1":
        return asp1_lines(measure_asp1())
    if piece == "protocols":
        return protocol_lines(measure_protocols())
    if piece in ("resume", "syncswitch", "transfer", "cloud_transfer", "planner"):
        return importlib.import_module(f"bench.{piece}").section()
    raise SystemExit(f"--only: one of {', '.join(PIECES)} (got {piece!r})")


def extra_sections() -> list[str]:
    """The sections of EXTRA_SECTIONS' modules; a note for each missing or failing one."""
    lines: list[str] = []
    for name in EXTRA_SECTIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                lines += [f"_Section `{name}` could not be imported: {exc}._", ""]
            else:
                print(f"{name}: not present, skipped", flush=True)
            continue
        print(f"section {name} ...", flush=True)
        try:
            lines += list(module.section())
        except Exception as exc:  # one broken section must not cost the others
            lines += [f"_Section `{name}` failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}_", ""]
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: nothing (the whole benchmark, ~40 min on 2 cores) or ``--only PIECE``. An unknown
    argument or ``--help`` is answered before anything is measured."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure the local stack on this machine and write docs/benchmarks.md "
                    "(the whole run takes about 40 minutes on 2 cores; make bench runs it).")
    parser.add_argument("--only", choices=PIECES, metavar="PIECE",
                        help="measure just this piece (one of: " + ", ".join(PIECES) + ") and "
                             "print its markdown instead of writing the document")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    OUT_DIR.mkdir(exist_ok=True)
    if args.only is not None:
        print("\n".join(only(args.only)))
        return 0
    print("baseline: single-process TensorFlow loop ...", flush=True)
    baseline = measure_baseline()
    rows, delays, run_dirs, pairs = measure_throughput()
    print("BSP against ASP ...", flush=True)
    protocols = measure_protocols()
    print("TensorFlow import (start-up baseline) ...", flush=True)
    imports = measure_tf_import()
    print("dry runs ...", flush=True)
    dry = measure_dry_runs()
    transient = measure_transient()
    extra = extra_sections()
    write_doc([*throughput_lines(baseline, rows), *asp1_lines(pairs),
               *protocol_lines(protocols),
               *startup_lines(delays, run_dirs, imports), *transient_lines(transient),
               *dry_run_lines(dry), *extra])
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


def write_doc(sections: list[str]) -> None:
    """docs/benchmarks.md: a header naming the machine, then the sections' lines in order."""
    header = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M')} "
        f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}). "
        "Every role of the local cluster shares these cores, so the cluster numbers show the "
        "overhead of the distributed stack, not scaling. Measurements made on their own, "
        "by date, and what was learnt from them: [benchmark-history.md](benchmark-history.md).",
        "",
    ]
    DOC.write_text("\n".join([*header, *sections]))


if __name__ == "__main__":
    sys.exit(main())
