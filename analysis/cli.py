"""``python -m analysis <command>``: one dispatcher over the analysis modules.

Each subcommand lives in its own module with a ``main(argv) -> int``; the dispatcher only picks
the module, imports it lazily (so ``--help`` is fast and one broken module does not break the
others) and passes the remaining arguments through.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# command → (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "speed-model": ("analysis.speed_model",
                    "per-step time from model/GPU features: fit, evaluate (--train/--test/--json)"),
    "scaling": ("analysis.scaling", "cluster-size scaling and parameter-server bottleneck"),
    "checkpoint-model": ("analysis.checkpoint_model", "checkpoint duration vs size"),
    "lifetimes": ("analysis.lifetimes",
                  "revocation lifetimes: Kaplan–Meier, Weibull/exponential fits, model export"),
    "cost": ("analysis.cost", "time, cost, savings of transient vs on-demand; Pareto frontier"),
    "syncswitch": ("analysis.syncswitch",
                   "accuracy/time per BSP→ASP switch point; offline switch-point policy"),
    "report": ("analysis.report", "HTML report with plots: report SOURCE --out DIR"),
}

EPILOG = """examples:
  python -m analysis report reference --out report/
  python -m analysis report multirun/syncswitch_digits/<time>-<pid> --out report/
  python -m analysis lifetimes --by-region --export revocation_models.json
  python -m analysis cost reference
  python -m analysis syncswitch reference --dataset cifar100_res50
  python -m analysis speed-model --train A.csv B.csv --test C.csv --json
Run 'python -m analysis COMMAND --help' for a command's options; --version for the tool's."""


def command_prog(command: str = "") -> str:
    """The words the user ran ``command`` by: ``python -m analysis cost``."""
    from orchestrator.version import prog_name

    return f"{prog_name('analysis')} {command}".rstrip()


def command_parser(command: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand's parser: its usage in the user's words, and ``--version``."""
    from orchestrator.version import tool_version

    parser = argparse.ArgumentParser(prog=command_prog(command), **kwargs)
    parser.add_argument("--version", action="version",
                        version=f"{command_prog(command)} {tool_version()}",
                        help="print the tool's version and exit")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_prog(),
        description="Analyses of distributed training on transient GPUs: the papers' reference "
        "data (SOURCE 'reference') and our own run/sweep directories.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Dispatch to ``COMMANDS[argv[0]]``'s ``main(rest)``; exit code 2 for usage errors and for
    a command whose module is not installed yet."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] == "--version":
        from orchestrator.version import version_line

        print(version_line("analysis"))
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.error(f"unknown command {command!r} (choose from {', '.join(COMMANDS)})")
    if rest == ["--version"]:  # argparse prints it and exits, before pandas, sklearn... load
        command_parser(command).parse_args(rest)
    module_name = COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"analysis: command {command!r} is not available: module {module_name} is missing",
              file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except FileNotFoundError as exc:  # a user error (wrong path), not a bug: one line, no trace
        print(f"analysis {command}: {exc}", file=sys.stderr)
        return 2
