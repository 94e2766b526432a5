"""The benchmarks' sidecar process: started, pinned, read and restarted as they drive it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from specctl.api import pb
from specctl.bench.sidecar_process import SidecarProcess
from specctl.testing.scripted_engine import ScriptedEngine, hello


@pytest.fixture
def workdir() -> Iterator[Path]:
    # unix socket paths are short: keep them out of pytest's deep tmp_path
    path = Path(tempfile.mkdtemp(prefix="specctl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _arms_of(policy: pb.Policy, workload_class: str) -> set[str]:
    return {a for e in policy.entries if e.workload_class == workload_class for a in e.arms}


def test_a_pinned_class_runs_its_arm_and_a_restart_starts_afresh(workdir: Path) -> None:
    sidecar = SidecarProcess(workdir, workdir, load_bucket_bounds=None)
    sidecar.start("specctl")
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello("bench-engine", drafters=[("ngram", 4)]))
        first = engine.recv_policy(timeout=30)
        sidecar.wait_connected(timeout_s=30)
        assert _arms_of(sidecar.policy_now(), "default") == {
            "off",
            "ngram/k=1",
            "ngram/k=2",
            "ngram/k=3",
            "ngram/k=4",
        }

        sidecar.override("greedy", "ngram/k=4")
        pinned = engine.recv_policy(timeout=30, min_version=first.version + 1)
        assert _arms_of(pinned, "greedy") == {"ngram/k=4"}
        assert _arms_of(sidecar.policy_now(), "greedy") == {"ngram/k=4"}
        assert "greedy" in {c.workload_class for c in sidecar.evidence().classes}
        sidecar.override("greedy", "")
        unpinned = engine.recv_policy(timeout=30, min_version=pinned.version + 1)
        assert len(_arms_of(unpinned, "greedy")) > 1
    finally:
        engine.close()

    stopped = sidecar.proc
    sidecar.start("static", {"arm": "off"})
    assert stopped is not None and stopped.returncode is not None
    assert sidecar.starts == 2 and sidecar.log_path.name == "sidecar-2.log"
    try:
        assert sidecar.policy_now().policy_name == "static"
    finally:
        sidecar.stop()
    assert sidecar.proc is None
