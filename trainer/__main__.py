"""Command line of the trainer roles (Contract 1).

    python -m trainer --role {ps,worker,chief,evaluator} --index I --spec PATH
    python -m trainer data ...   (trainer/data.py's CLI: what the deployer runs on a host to
                                  fetch a dataset itself or list what it already holds)
    python -m trainer --version

Environment set here, before TensorFlow is imported (it reads them once at import):
quiet C++ logging, and gRPC keepalive within TF's servers' ping policy (a call that never
returns, to a peer that vanished without an RST, fails after about 6 min, not never).

Exit codes: 0 done (chief, evaluator) or stopped; 1 failure (a `failure` event says why);
3 the chief lost a parameter server (`failure` with `error_kind: ps_unavailable`,
trainer/control.py): restart the cluster, the new chief resumes from the latest checkpoint;
143 SIGTERM.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import traceback
from types import FrameType

from trainer import layout
from trainer.keepalive import grpc_client_options

# gRPC keepalive that TF's servers accept (trainer/keepalive.py explains the numbers).
GRPC_KEEPALIVE = grpc_client_options()
ROLES = layout.ROLES
EXIT_SIGTERM = layout.EXIT_SIGTERM
# The evaluator is a side-car: on a shared host its TensorFlow import and evaluations must
# not take CPU from the servers and the chief (a quarter of the start-up on 2 cores).
EVALUATOR_NICE = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Run one role of a parameter-server training job described by a "
                    "trainer spec JSON (trainer/spec.py). Events go to stdout as "
                    "'@event {json}' lines; everything else is log text.",
        epilog="Local example (4 terminals, same spec):\n"
               "  python -m trainer --role ps --index 0 --spec run/trainer_spec.json\n"
               "  python -m trainer --role worker --index 0 --spec run/trainer_spec.json\n"
               "  python -m trainer --role chief --index 0 --spec run/trainer_spec.json\n"
               "  python -m trainer --role evaluator --index 0 --spec run/trainer_spec.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="ps/worker: serve variables/compute until stopped; chief: run the "
                             "training loop and exit 0 after the final checkpoint; evaluator: "
                             "evaluate checkpoints, exit 0 after the final one")
    parser.add_argument("--index", type=int, default=0,
                        help="task index within the role's list in spec.cluster (default 0)")
    parser.add_argument("--spec", required=True, help="path of the trainer spec JSON")
    # parsed before anything imports TensorFlow: --version answers at once
    parser.add_argument("--version", action="version", version=layout.version_line("trainer"),
                        help="print the tool's version and exit")
    return parser.parse_args(argv)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # os._exit: TF's gRPC and coordinator threads are non-daemon C++ threads; a normal
    # sys.exit would wait on them (or deadlock in their destructors) and hang the process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_SIGTERM)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["data"]:  # `python -m trainer data ...`: the data CLI, through the same
        from trainer import data  # argv prefix as the roles (HostRunner.trainer_command)

        return data.main(argv[1:])
    args = parse_args(argv)
    os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_KEEPALIVE)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGTERM, _on_sigterm)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack to stderr

    from trainer import events
    from trainer.control import watch_lease, watch_preemption_notice
    from trainer.startup import STARTUP
    events.set_identity(args.role, args.index)
    STARTUP.mark("interpreter")
    if args.role == layout.ROLE_EVALUATOR:
        os.nice(EVALUATOR_NICE)
    watch_preemption_notice()  # every role: `preemption_notice` event when the file appears
    watch_lease()  # every role: ends once the orchestrator stops renewing its lease
    folders = [os.getcwd()]  # where this role writes, for a full disk's report
    try:
        from trainer.spec import TrainerSpec
        spec = TrainerSpec.from_json(args.spec)
        folders += [spec.layout.root, spec.layout.checkpoints]  # gs:// ones: not statvfs'd
        if args.role in (layout.ROLE_PS, layout.ROLE_WORKER):
            from trainer.server import run_server
            run_server(spec, args.role, args.index)
            return 0
        if args.role == layout.ROLE_CHIEF:
            from trainer.loop import train
            train(spec)
        else:
            from trainer.evaluator import run_evaluator
            run_evaluator(spec)
    except KeyboardInterrupt:
        return layout.EXIT_INTERRUPTED
    except BaseException as exc:  # report every failure as an event, then exit non-zero
        traceback.print_exc()
        events.emit(events.EVENT_FAILURE, error=f"{type(exc).__name__}: {exc}",
                    **events.disk_full_fields(exc, folders))
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: TF's coordinator threads can block a normal exit for minutes
    # (platform-notes: the chief took 120 s to leave); everything durable is already written.
    os._exit(code)
