"""Check a vLLM release's source against what specctl's engine side relies on, uninstalled.

Reads the hooks, methods, fields and attributes listed in
``controller/engine/vllm_compat.py`` from a vLLM wheel or source tree with
``ast`` (nothing of vLLM is imported) and prints, per item, OK or what
differs. Exits 1 if anything differs, 0 otherwise. Run by hand before
accepting a new vLLM release (a wheel is hundreds of MB, so CI does not):

    pip download vllm==X.Y.Z --no-deps -d /tmp/vllm
    .venv/bin/python benchmarks/check_vllm_source.py /tmp/vllm/vllm-X.Y.Z-*.whl
    .venv/bin/python benchmarks/check_vllm_source.py .venv/lib/python3.11/site-packages/vllm

An all-OK result says the names and signatures hold; what the hooks' vLLM
methods do with them still needs reading (see docs/engine-safety.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specctl.engine.vllm_compat import (
    SUPPORTED_VLLM_VERSIONS,
    VllmSource,
    check_source,
    describe,
    version_supported,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a vLLM wheel, or a directory holding vllm/")
    args = parser.parse_args(argv)
    source = VllmSource(args.source)
    version = source.version()
    accepted = "accepted" if version_supported(version) else "not accepted"
    print(f"vLLM {version} from {args.source}")
    print(
        f"start-up version check: {accepted} "
        f"(supported: {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)})"
    )
    findings = check_source(source)
    width = min(max(len(describe(f.item)) for f in findings), 72)
    for finding in findings:
        name = describe(finding.item).ljust(width)
        print(f"  {name}  {'OK' if finding.problem is None else 'DIFFERS: ' + finding.problem}")
    broken = sum(f.problem is not None for f in findings)
    print(f"{len(findings) - broken} of {len(findings)} items OK, {broken} differ")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
