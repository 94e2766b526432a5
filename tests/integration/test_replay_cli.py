"""``specctl replay`` end to end: a log directory in, a ranked table, JSON and a report out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from replay_support import Environment, logging_dist, run

from specctl.decisionlog import DecisionLogConfig, DecisionLogWriter
from specctl.policy.registry import POLICIES
from specctl.replay.candidates import parse_policy_spec

ROOT = Path(__file__).resolve().parents[2]


def specctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", "replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("log") / "decisions"
    rng = np.random.default_rng(4)
    with DecisionLogWriter(DecisionLogConfig(directory, rotate_bytes=50_000)) as writer:
        for i in range(8):
            writer(run(Environment(), logging_dist(), 400, rng, first_step=i * 400).batch)
            writer.flush()
    return directory


def test_replay_ranks_candidates_and_writes_json_and_report(log_dir: Path, tmp_path: Path) -> None:
    out = specctl(
        str(log_dir),
        "--policy",
        "ngram/k=4",
        "--policy",
        "off",
        "--policy",
        "static:arm=ngram/k=2",
        "--bootstrap",
        "100",
        "--json",
        str(tmp_path / "out.json"),
        "--report",
        str(tmp_path / "report"),
    )
    assert out.returncode == 0, out.stderr
    assert "== all ==" in out.stdout and "== chat ==" in out.stdout
    table = out.stdout.split("== all ==")[1].split("==")[0]
    ranked = [line.split()[1] for line in table.splitlines()[2:] if line[:4].strip().isdigit()]
    assert ranked == ["static:arm=ngram/k=2", "ngram/k=4", "off"]

    payload = json.loads((tmp_path / "out.json").read_text())
    assert payload["rows"] > 0 and payload["files"]
    assert [r["candidate"] for r in payload["ranking"]["all"]] == ranked
    estimators = {(r["candidate"], r["estimator"]) for r in payload["results"]}
    assert len(estimators) == 3 * 5
    for r in payload["results"]:
        assert r["goodput_low"] <= r["goodput"] <= r["goodput_high"], r
        assert r["effective_sample_size"] > 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "goodput-all.png" in report
    for scope in ("all", "chat", "code"):
        png = tmp_path / "report" / f"goodput-{scope}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_named_and_fatal_unless_skipped(log_dir: Path, tmp_path: Path) -> None:
    files = sorted(log_dir.glob("decisions-*.parquet"))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(files[0].read_bytes()[:500])
    args = [str(f) for f in files] + [str(broken), "--policy", "off", "--bootstrap", "20"]
    out = specctl(*args)
    assert out.returncode == 2
    assert "broken.parquet: not a readable Parquet file" in out.stderr
    out = specctl(*args, "--on-bad-input", "skip")
    assert out.returncode == 0, out.stderr
    assert "skipped" in out.stderr and "broken.parquet" in out.stderr


def test_a_candidate_the_log_cannot_speak_for_is_refused(log_dir: Path) -> None:
    out = specctl(str(log_dir), "--policy", "ngram/k=9", "--bootstrap", "20")
    assert out.returncode == 2
    assert "cannot evaluate ngram/k=9" in out.stderr
    out = specctl(str(log_dir), "--policy", "nosuchpolicy", "--bootstrap", "20")
    assert out.returncode == 2
    assert "unknown policy 'nosuchpolicy'" in out.stderr


def test_help_names_the_registered_policies_and_its_examples_run() -> None:
    out = specctl("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    missing = [name for name in POLICIES if name not in text]
    assert not missing, f"--help does not name the policies {missing}"
    examples = re.findall(r"--policy ([a-z][^\s]*)", out.stdout)
    assert examples
    for spec in examples:
        parse_policy_spec(spec)  # raises on a policy the registry does not have
