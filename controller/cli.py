"""The ``specctl`` command line: one subcommand per concern.

Each subcommand lives next to the code it drives and exposes
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported
when the parser is built, so they keep heavy imports (vLLM, matplotlib)
inside ``run``. Only the subcommand being run gets its arguments built, so
one whose options come from a registry (``replay``: the policies and the
estimators) costs the others nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from specctl import __version__

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("specctl.demo.run", "run vLLM with specctl, the sidecar and a mixed workload"),
    "serve": ("specctl.sidecar.serve_cli", "run the sidecar (gRPC controller and /metrics)"),
    "policy": ("specctl.sidecar.policy_cli", "print the running sidecar's current policy"),
    "evidence": ("specctl.sidecar.evidence_cli", "print the evidence behind the policy"),
    "override": ("specctl.sidecar.override_cli", "pin a workload class to an arm (admin)"),
    "replay": ("specctl.replay.cli", "evaluate candidate policies offline on decision logs"),
    "bench": (
        "specctl.bench.cli",
        "run every policy side by side: simulated, or on a real vLLM engine (--engine vllm)",
    ),
    "simulate": ("specctl.sim.simulate_cli", "drive a running sidecar with a simulated engine"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``command``: build that subcommand's arguments alone (None: all)."""
    parser = argparse.ArgumentParser(
        prog="specctl",
        description=(
            "Adaptive controller for speculative decoding in vLLM: picks the drafter and "
            "proposal length K (or off) per workload class and load, online."
        ),
    )
    parser.add_argument("--version", action="version", version=f"specctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if command is None or command == name:
            module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(command).parse_args(argv)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
