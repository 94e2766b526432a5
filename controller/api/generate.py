"""Regenerate the Python protocol code from proto/.

The generated modules are committed (users install specctl into vLLM images
without grpcio-tools); tests run this into a temporary directory and fail on
any difference, so the committed code never drifts from the .proto.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ["specctl/v1/controller.proto"]
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc into out_dir; rewrite imports to live under specctl.api."""
    from grpc_tools import protoc  # dev dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(PROTO_ROOT / p) for p in PROTO_FILES],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    written = []
    for path in sorted(out_dir.rglob("*.py*")):
        text = path.read_text()
        text = text.replace("from specctl.v1 import", "from specctl.api.specctl.v1 import")
        path.write_text(text)
        written.append(path)
    for pkg in (out_dir / "specctl", out_dir / "specctl" / "v1"):
        (pkg / "__init__.py").write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        dest = PACKAGE_DIR / "specctl"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(pathlib.Path(tmp) / "specctl", dest)
    print(f"generated into {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
