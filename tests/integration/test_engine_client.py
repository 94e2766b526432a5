"""The engine's sidecar client and settings, against the real sidecar on a unix socket."""

from __future__ import annotations

import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from specctl.api import pb
from specctl.arms import Arm
from specctl.engine.client import SidecarClient
from specctl.engine.config import ConfigError, EngineConfig
from specctl.sidecar.config import load_config
from specctl.steps import StepRecord
from specctl.testing.sidecar_thread import SidecarThread

K4 = Arm("ngram", 4)


class _Step:
    def __init__(self, record: StepRecord) -> None:
        self._record = record

    def record(self) -> StepRecord:
        return self._record


def _step(i: int) -> _Step:
    return _Step(
        StepRecord(
            step_index=i, step_time_s=0.01, batch_size=2, num_scheduled_tokens=7,
            policy_version=0, load_bucket=0, step_end_unix_s=time.time(),
            classes=["chat", "chat"], arms=["ngram/k=4", "ngram/k=4"], propensity=[1.0, 1.0],
            drafted=[4, 2], accepted=[3, 0],
        )
    )  # fmt: skip


def _client(address: str, **kw: object) -> SidecarClient:
    settings: dict[str, object] = {"report_interval_s": 0.05, **kw}
    config = EngineConfig(
        address=address, reconnect_min_s=0.05, reconnect_max_s=0.2,
        engine_id="test-engine", **settings,  # type: ignore[arg-type]
    )  # fmt: skip
    hello = pb.Hello(
        engine_id="test-engine", model="tiny", vllm_version="0.32.0",
        drafters=[pb.Drafter(method="ngram", max_k=4)], max_batch_size=8,
        fallback_arm="ngram/k=4", specctl_version="test",
    )  # fmt: skip
    return SidecarClient(config, hello, {"ngram": 4}, K4)


def _start_sidecar(socket_path: Path) -> SidecarThread:
    overrides = {
        "server.listen": f"unix://{socket_path}",
        "server.metrics_listen": "127.0.0.1:0",
        "server.grace_period_s": 0.5,
        "log.format": "json",
        "policy.overrides": {"chat": "ngram/k=2"},
    }
    config = load_config(None, env={}, overrides=overrides)
    return SidecarThread(config, flag_overrides=overrides).start()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_connects_applies_policy_reports_and_falls_back_when_the_sidecar_goes() -> None:
    socket_path = Path(tempfile.mkdtemp(prefix="specctl-c-")) / "s.sock"
    sidecar = _start_sidecar(socket_path)
    client = _client(f"unix://{socket_path}")
    try:
        assert client.view.version == 0  # fallback until a policy arrives
        client.start()
        assert _wait(lambda: client.view.version > 0), client.state()
        assert client.view.choose("chat", 0, 0.5).arm.name == "ngram/k=2"  # pinned class
        for i in range(5):
            client.push(_step(i + 1))
        url = sidecar.metrics_url
        assert _wait(lambda: _metric(url, "specctl_reports_received_total") >= 1)
        assert _wait(lambda: _metric(url, "specctl_draft_tokens_total") >= 30)
        assert client.state().reports_rejected_total == 0
        # the status that says the engine left fallback follows its first policy
        assert _wait(lambda: _metric(url, "specctl_engines_in_fallback") == 0)

        sidecar.stop(grace=0.1)
        assert _wait(lambda: client.view.version == 0), client.state()
        state = client.state()
        assert state.in_fallback
        assert not state.connected
        assert "sidecar" in state.fallback_reason
        assert client.view.choose("chat", 0, 0.5).arm == K4  # the engine's fallback arm

        sidecar = _start_sidecar(socket_path)  # back: reconnects and re-sends its hello
        assert _wait(lambda: client.view.version > 0), client.state()
        assert client.state().connects_total >= 2
    finally:
        client.close()
        sidecar.stop(grace=0.1)


def test_full_queue_drops_oldest_and_counts() -> None:
    client = _client("unix:///nonexistent-dir/specctl.sock", report_queue_size=3)
    for i in range(8):
        client.push(_step(i + 1))
    assert client.steps_dropped_total == 5
    assert [s.record().step_index for s in client.queue] == [6, 7, 8]


def test_policy_older_than_max_age_falls_back() -> None:
    socket_path = Path(tempfile.mkdtemp(prefix="specctl-c-")) / "s.sock"
    sidecar = _start_sidecar(socket_path)
    client = _client(f"unix://{socket_path}", max_policy_age_s=0.3)
    try:
        client.start()
        assert _wait(lambda: client.view.version > 0)
        # The sidecar pushes only on change: the policy ages out while connected.
        assert _wait(lambda: client.view.version == 0, timeout=5.0)
        assert "old" in client.state().fallback_reason
    finally:
        client.close()
        sidecar.stop(grace=0.1)


def test_config_from_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text(
        '[engine]\naddress = "unix:///run/s.sock"\nfallback_arm = "off"\n'
        'class_from_prompt_len = ["short:64", "long"]\nload_buckets = [8, 32]\n'
    )
    config = EngineConfig.load(
        {"SPECCTL_CONFIG": str(path), "SPECCTL_ADDRESS": "127.0.0.1:7000", "SPECCTL_SEED": "3"}
    )
    assert config.address == "127.0.0.1:7000"  # the environment wins over the file
    assert config.fallback(K4).name == "off"
    assert config.load_buckets == (8, 32)
    assert config.seed == 3
    assert config.class_for_prompt_len(10) == "short"
    assert config.class_for_prompt_len(1000) == "long"
    assert EngineConfig.load({}).fallback(K4) == K4  # default: the engine's own setting
    assert EngineConfig.load({}).step_clock == "wall"
    assert EngineConfig.load({"SPECCTL_STEP_CLOCK": "process_cpu"}).step_clock == "process_cpu"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SPECCTL_FALLBACK_ARM": "ngram/k=x"}, "fallback_arm"),
        ({"SPECCTL_REPORT_QUEUE_SIZE": "many"}, "SPECCTL_REPORT_QUEUE_SIZE='many'"),
        ({"SPECCTL_DEFAULT_CLASS": "no spaces"}, "default_class"),
        ({"SPECCTL_CLASS_FROM_PROMPT_LEN": "any,short:10"}, "only the last"),
        ({"SPECCTL_LOAD_BUCKETS": "32,8"}, "load_buckets"),
        ({"SPECCTL_MAX_POLICY_AGE_S": "-1"}, "max_policy_age_s"),
        ({"SPECCTL_STEP_CLOCK": "cpu"}, "step_clock='cpu' must be one of wall, process_cpu"),
    ],
)
def test_bad_settings_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        EngineConfig.load(env)


def test_unknown_file_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('adress = "unix:///x.sock"\n')
    with pytest.raises(ConfigError, match="unknown key 'adress'"):
        EngineConfig.load({"SPECCTL_CONFIG": str(path)})


def test_process_tree_cpu_clock_counts_the_workers() -> None:
    """The CPU clock sums the engine core and its children, where vLLM's CPU build runs
    the model; time spent waiting counts for nothing."""
    import subprocess
    import sys

    from specctl.engine.step_clock import ProcessTreeCPUClock

    burn = (
        "import time\n"
        "while time.process_time() < 0.4: pass\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        clock = ProcessTreeCPUClock()
        before = clock()  # finds the child
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"
        after = clock()
        # the child's 0.4 s of CPU (minus what it used before the first reading)
        assert after - before >= 0.2, (before, after)
        time.sleep(0.3)
        assert clock() - after < 0.1  # sleeping uses no CPU
    finally:
        child.kill()
        child.wait()
    assert clock() >= 0.0  # an exited process is dropped, not an error


def test_a_streams_first_report_goes_out_within_an_eighth_of_the_interval() -> None:
    socket_path = Path(tempfile.mkdtemp(prefix="specctl-c-")) / "s.sock"
    sidecar = _start_sidecar(socket_path)
    interval = 2.0
    client = _client(f"unix://{socket_path}", report_interval_s=interval)
    try:
        client.start()
        assert _wait(lambda: client.view.version > 0), client.state()
        url = sidecar.metrics_url
        pushed = time.monotonic()
        client.push(_step(1))
        assert _wait(lambda: _metric(url, "specctl_reports_received_total") >= 1)
        # within FIRST_REPORT_SHARE of the interval (0.25 s) and a busy machine's lag,
        # where a report every interval would have come about 2 s after the stream began
        assert time.monotonic() - pushed < 0.5 * interval, client.state()
        # the waits then double up to the interval: a few more steps, a few more reports
        # in the next second, not one a wake-up
        for i in range(2, 40):
            client.push(_step(i))
            time.sleep(0.025)
        sent = client.state().reports_sent_total
        assert 2 <= sent <= 6, client.state()
    finally:
        client.close()
        sidecar.stop(grace=0.1)
