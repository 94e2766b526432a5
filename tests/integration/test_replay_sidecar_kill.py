"""A real ``specctl serve`` SIGKILLed while it writes its decision log leaves a log that replays."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from engine_support import SidecarProcess

from specctl.api import pb
from specctl.decisionlog import read_decision_log
from specctl.protocol.reports import encode_step_report
from specctl.steps import StepRecord
from specctl.testing.scripted_engine import ScriptedEngine, hello

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["off", "ngram/k=1", "ngram/k=2", "ngram/k=4"]
CLASSES = ["chat", "code"]
STEPS, ROWS = 3, 8  # per report


def reports(seed: int) -> Iterator[pb.StepReport]:
    rng = np.random.default_rng(seed)
    t = time.time()
    seq = 0
    while True:
        seq += 1
        steps = []
        for j in range(STEPS):
            t += 0.01
            classes = sorted(CLASSES[i] for i in rng.integers(0, 2, ROWS))
            draw = {c: int(rng.integers(0, len(ARMS))) for c in CLASSES}
            arms = [ARMS[draw[c]] for c in classes]
            drafted = [0 if a == "off" else int(a[-1]) for a in arms]
            steps.append(
                StepRecord(
                    step_index=seq * STEPS + j,
                    step_time_s=float(0.02 + 0.002 * sum(drafted) / ROWS),
                    batch_size=ROWS,
                    num_scheduled_tokens=ROWS + sum(drafted),
                    policy_version=1,
                    load_bucket=0,
                    step_end_unix_s=t,
                    classes=classes,
                    arms=arms,
                    propensity=[0.25] * ROWS,
                    drafted=drafted,
                    accepted=[int(rng.binomial(d, 0.6)) for d in drafted],
                )
            )
        yield encode_step_report(seq, steps)


def _logged_reports(decisions: Path) -> int:
    """The last report sequence in the log's files so far (0 if none): files under their
    final names are whole, and one merged away meanwhile is skipped."""
    last = 0
    for path in decisions.glob("decisions-*.parquet"):
        try:
            seqs = pq.read_table(path, columns=["report_sequence"]).column(0).to_numpy()
        except OSError:
            continue
        if seqs.size:
            last = max(last, int(seqs.max()))
    return last


@pytest.fixture
def workdir() -> Iterator[Path]:
    # unix socket paths are short: keep them out of pytest's deep tmp_path
    path = Path(tempfile.mkdtemp(prefix="specctl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sigkilled_sidecar_leaves_a_decision_log_that_replays(workdir: Path) -> None:
    state = workdir / "state"
    sidecar = SidecarProcess(
        workdir,
        policy="specctl",
        config=f'[state]\ndir = "{state}"\nlog_flush_interval_s = 0.05\n',
    )
    sidecar.start()
    engine = ScriptedEngine(sidecar.address)
    sent = 0
    try:
        engine.send(hello("engine-a", drafters=(("ngram", 4),)))
        engine.recv_policy(timeout=30)
        decisions = state / "decisions"
        for report in reports(seed=1):
            engine.send(report)
            sent += 1
            time.sleep(0.002)
            # kill while reports still stream in and segments are being written, once the
            # log holds enough to replay (on a loaded machine the sidecar lags the sender)
            if sent >= 300 and sent % 25 == 0 and _logged_reports(decisions) >= 100:
                sidecar.kill()
                break
            assert sent < 20_000, "the sidecar logged fewer than 100 reports"
    finally:
        engine.close()
        sidecar.stop()

    log = read_decision_log([decisions])  # on_bad_input="fail": any unreadable file raises
    assert log.problems == []
    seqs = log.table.column("report_sequence").to_numpy()
    received = np.unique(seqs)
    # every report it logged is whole, and what it logged is a prefix of what was sent:
    # the kill lost at most the batch that was not yet flushed
    assert received.tolist() == list(range(1, received.size + 1))
    assert np.all(np.bincount(seqs)[1:] == STEPS * ROWS)
    assert 100 <= received.size <= sent

    out = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "replay", str(decisions), "--policy", "off",
         "--policy", "ngram/k=2", "--bootstrap", "50"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"{log.num_rows} request-rounds" in out.stdout
