"""Shared fixtures: a real sidecar, in-process, on a unix socket or on TCP loopback."""

from __future__ import annotations

import os

# The CPU engines' OpenMP threads sleep when idle instead of spinning: their CPU time (the
# step clock of the convergence test, and its sweep) then measures work, not spin-waiting
# that grows and shrinks with whatever else the machine runs. libgomp reads this when it is
# loaded, so it is set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.sidecar.config import load_config
from specctl.testing.sidecar_thread import SidecarThread

SidecarFactory = Callable[..., SidecarThread]


@pytest.fixture
def sidecar_factory() -> Iterator[SidecarFactory]:
    """Start sidecars: ``factory(transport="unix"|"tcp", config_path=None, **settings)``.

    ``settings`` are "section_key" keyword arguments (``policy_params={"arm": "off"}``),
    applied like command-line flags. Each sidecar gets a free metrics port and is
    stopped at the end of the test.
    """
    started: list[SidecarThread] = []
    # Unix socket paths are limited to ~100 bytes: keep them out of pytest's deep tmp_path.
    socket_dir = Path(tempfile.mkdtemp(prefix="specctl-"))

    def factory(
        transport: str = "unix", config_path: Path | None = None, **settings: Any
    ) -> SidecarThread:
        overrides: dict[str, Any] = {
            "server.metrics_listen": "127.0.0.1:0",
            "server.grace_period_s": 1.0,
            "log.format": "json",
        }
        if transport == "unix":
            overrides["server.listen"] = f"unix://{socket_dir}/sidecar-{len(started)}.sock"
        else:
            overrides["server.listen"] = "127.0.0.1:0"
        for key, value in settings.items():
            section, _, name = key.partition("_")
            overrides[f"{section}.{name}"] = value
        config = load_config(config_path, env={}, overrides=overrides)
        sidecar = SidecarThread(config, flag_overrides=overrides).start()
        started.append(sidecar)
        return sidecar

    yield factory
    for sidecar in started:
        sidecar.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def sidecar(sidecar_factory: SidecarFactory) -> SidecarThread:
    """A sidecar on a unix socket with the default (static, off) policy.

    ``.address`` is its gRPC target, ``.metrics_url`` its /metrics, ``.sidecar`` the server.
    """
    return sidecar_factory("unix")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama with its tokenizer, built once per session (no download)."""
    from specctl.testing.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def testbed_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The testbed's target and its derived draft, built once per session: (target, draft)."""
    from specctl.demo.testbed_model import build_testbed_models

    target, draft = build_testbed_models(tmp_path_factory.mktemp("testbed-models"))
    return str(target), str(draft)
