"""The sidecar over real gRPC: unix socket and TCP, pushes, health, reflection, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specctl.api import SERVICE_NAME, pb, pb_grpc
from specctl.arms import OFF
from specctl.policy.static import StaticPolicy
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import load_config, unix_socket_path
from specctl.sidecar.publishing import PolicyMessages
from specctl.sidecar.sessions import Outbox
from specctl.steps import StepBatch
from specctl.testing.scripted_engine import ScriptedEngine, hello, report, scrape, wait_for
from specctl.testing.sidecar_thread import SidecarThread


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_engine_gets_policy_and_a_new_version_for_a_new_class(sidecar_factory, transport) -> None:
    sc = sidecar_factory(transport, policy_name="static", policy_params={"arm": "ngram/k=4"})
    assert sc.address.startswith("unix://") == (transport == "unix")
    engine = ScriptedEngine(sc.address)
    try:
        engine.send(hello(drafters=[("ngram", 4)]))
        first = engine.recv_policy()
        assert first.policy_name == "static"
        assert list(first.load_bucket_bounds) == [8, 32, 128]
        default = [e for e in first.entries if e.workload_class == "default"]
        assert len(default) == 4
        assert all(list(e.arms) == ["ngram/k=4"] for e in default)

        engine.send(report(1, workload_class="chat"))
        pushed = engine.recv_policy(min_version=first.version + 1)
        assert {e.workload_class for e in pushed.entries} == {"default", "chat"}
        with grpc.insecure_channel(sc.address) as channel:
            current = pb_grpc.SpecControllerStub(channel).GetPolicy(pb.GetPolicyRequest())
        assert current.version == pushed.version
    finally:
        engine.close()


def test_engine_without_the_drafter_gets_its_runnable_arms_only(sidecar_factory) -> None:
    sc = sidecar_factory(policy_name="static", policy_params={"arm": "ngram/k=4"})
    engines = {name: ScriptedEngine(sc.address) for name in ("big", "small", "none")}
    try:
        engines["big"].send(hello("big", drafters=[("ngram", 4)]))
        assert engines["big"].recv_policy().entries[0].arms == ["ngram/k=4"]
        engines["small"].send(hello("small", drafters=[("ngram", 2)], fallback_arm="ngram/k=2"))
        engines["none"].send(hello("none", drafters=[], fallback_arm="off"))
        for name, arm in (("small", "ngram/k=2"), ("none", "off")):
            policy = engines[name].recv_policy()
            assert policy.fallback_arm == arm
            assert {a for e in policy.entries for a in e.arms} == {arm}
            assert all("not runnable here" in e.explanation for e in policy.entries)
    finally:
        for engine in engines.values():
            engine.close()


def test_configuration_change_pushes_a_new_version(sidecar_factory, tmp_path: Path) -> None:
    config = tmp_path / "specctl.toml"
    config.write_text('[policy]\nname = "static"\nparams = { arm = "off" }\n')
    sc = sidecar_factory(config_path=config)
    engine = ScriptedEngine(sc.address)
    try:
        engine.send(hello(drafters=[("ngram", 4)]))
        before = engine.recv_policy()
        assert {a for e in before.entries for a in e.arms} == {"off"}

        config.write_text(
            '[policy]\nname = "static"\nparams = { arm = "ngram/k=3" }\n'
            '[policy.overrides]\nsummarize = "off"\n'
        )
        st = config.stat()
        os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
        after = engine.recv_policy(min_version=before.version + 1)
        by_class = {(e.workload_class, e.load_bucket): list(e.arms) for e in after.entries}
        assert by_class[("default", 0)] == ["ngram/k=3"]
        assert by_class[("summarize", 0)] == ["off"]
        assert (
            "operator"
            in next(e for e in after.entries if e.workload_class == "summarize").explanation
        )
    finally:
        engine.close()


def test_invalid_configuration_change_keeps_the_running_policy(sidecar_factory, tmp_path) -> None:
    config = tmp_path / "specctl.toml"
    config.write_text('[policy]\nname = "static"\nparams = { arm = "off" }\n')
    sc = sidecar_factory(config_path=config)
    config.write_text('[policy]\nname = "static"\nparams = { arm = "bogus" }\n')
    assert sc.run(sc.sidecar.reload_config) is False
    assert sc.sidecar.config.policy.params == {"arm": "off"}


def test_health_serving_and_reflection_lists_the_service(sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"specctl.v1.SpecController", "specctl.v1.SpecControllerAdmin"} <= names


def test_unix_socket_is_private_to_the_owner(sidecar) -> None:
    mode = os.stat(unix_socket_path(sidecar.address)).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_metrics_count_reports_and_sessions_go_away(sidecar_factory) -> None:
    sc = sidecar_factory(policy_name="static", policy_params={"arm": "ngram/k=4"})
    engine = ScriptedEngine(sc.address)
    engine.send(hello())
    first = engine.recv_policy()
    engine.send(
        report(1, arms=["ngram/k=4", "ngram/k=4", "off"], drafted=[4, 4, 0], accepted=[4, 1, 0])
    )
    engine.send(report(4))  # reports 2 and 3 were lost
    engine.send(
        pb.EngineStatus(
            in_fallback=True,
            fallback_reason="test",
            reports_dropped_total=5,
            policy_age_s=7.5,
            policy_version=first.version,
        )
    )
    # both learned (the second in the round after the first's)
    wait_for(lambda: scrape(sc.metrics_url)["specctl_policy_update_latency_seconds_count"] == 2)
    m = scrape(sc.metrics_url)
    assert m["specctl_reports_received_total"] == 2
    labels = 'drafter="ngram",workload_class="chat"'
    assert m[f"specctl_request_rounds_total{{{labels}}}"] == 3
    assert m[f"specctl_draft_tokens_total{{{labels}}}"] == 12
    assert m[f"specctl_accepted_tokens_total{{{labels}}}"] == 8
    per_position = [
        m[
            f'specctl_accepted_tokens_per_position_total{{drafter="ngram",position="{p}",workload_class="chat"}}'
        ]
        for p in (1, 2, 3, 4)
    ]
    assert per_position == [3, 2, 2, 1]  # accepted 4, 1 and 3
    assert m['specctl_arm_rounds_total{arm="off",workload_class="chat"}'] == 2
    assert m['specctl_arm_rounds_total{arm="ngram/k=4",workload_class="chat"}'] == 3
    assert m['specctl_arm_probability{arm="ngram/k=4",load_bucket="0",workload_class="chat"}'] == 1
    assert m['specctl_speculation_off{load_bucket="0",workload_class="chat"}'] == 0
    wait_for(lambda: scrape(sc.metrics_url)["specctl_engines_in_fallback"] == 1)
    m = scrape(sc.metrics_url)
    assert m["specctl_reports_dropped_total"] == 2 + 5
    assert m["specctl_decision_age_seconds"] == 7.5
    assert m["specctl_engines_connected"] == 1
    assert m["specctl_classes"] == 2
    assert m["specctl_policy_update_latency_seconds_count"] == 2
    assert m['specctl_build_info{version="0.1.0"}'] == 1

    # the first policy, then the one with class "chat"
    assert engine.recv_policy(min_version=first.version + 1).version > first.version
    wait_for(lambda: scrape(sc.metrics_url)["specctl_policy_pushes_total"] == 2)

    engine.close()
    wait_for(lambda: scrape(sc.metrics_url)["specctl_engines_connected"] == 0)
    assert scrape(sc.metrics_url)["specctl_engines_in_fallback"] == 0
    assert sc.run(lambda: len(sc.sidecar.sessions)) == 0


def test_group_readable_socket_when_configured(sidecar_factory) -> None:
    sc = sidecar_factory(server_socket_mode="0660")
    assert stat.S_IMODE(os.stat(unix_socket_path(sc.address)).st_mode) == 0o660


def test_engines_beyond_max_engines_are_refused(sidecar_factory) -> None:
    sc = sidecar_factory(server_max_engines=1)
    first, second = ScriptedEngine(sc.address), ScriptedEngine(sc.address)
    try:
        first.send(hello("first"))
        first.recv_policy()
        second.send(hello("second"))
        error = second.wait_closed()
        assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "server.max_engines=1" in (error.details() or "")
        first.send(report(1))  # the connected engine is unaffected
        assert first.recv_policy(min_version=2).version >= 2
    finally:
        first.close()
        second.close()


def test_health_turns_not_serving_on_shutdown(sidecar_factory) -> None:
    sc = sidecar_factory("tcp")
    with grpc.insecure_channel(sc.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30
        )
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        sc.stop()
        statuses = []
        with contextlib.suppress(grpc.RpcError):
            statuses.extend(answer.status for answer in watch)
    assert statuses[0] == health_pb2.HealthCheckResponse.NOT_SERVING


def test_outbox_keeps_only_the_latest_policy_for_a_slow_engine() -> None:
    async def scenario() -> list[pb.ControllerMessage] | None:
        outbox = Outbox()
        for version in (1, 2, 3):
            outbox.put_policy(pb.Policy(version=version))
        outbox.put_rejection(pb.ReportRejected(sequence=7))
        first = await outbox.get()
        outbox.close()
        assert await outbox.get() is None
        return first

    messages = asyncio.run(scenario())
    assert messages is not None
    assert [m.WhichOneof("kind") for m in messages] == ["rejected", "policy"]
    assert messages[1].policy.version == 3


def test_dropped_reports_are_not_counted_twice_across_reconnects(sidecar) -> None:
    def connect_and_report_drops(total: int) -> None:
        engine = ScriptedEngine(sidecar.address)
        try:
            engine.send(hello("engine-1"))
            engine.recv_policy()
            engine.send(pb.EngineStatus(reports_dropped_total=total))
            engine.send(report(1))  # processed after the status, on the same stream
            wait_for(lambda: scrape(sidecar.metrics_url)["specctl_reports_received_total"] > n[0])
            n[0] += 1
        finally:
            engine.close()
        wait_for(lambda: scrape(sidecar.metrics_url)["specctl_engines_connected"] == 0)

    n = [0]
    connect_and_report_drops(5)
    assert scrape(sidecar.metrics_url)["specctl_reports_dropped_total"] == 5
    connect_and_report_drops(5)  # the same engine again: nothing new was dropped
    assert scrape(sidecar.metrics_url)["specctl_reports_dropped_total"] == 5
    connect_and_report_drops(8)
    assert scrape(sidecar.metrics_url)["specctl_reports_dropped_total"] == 8
    connect_and_report_drops(2)  # a restarted engine counts from zero
    assert scrape(sidecar.metrics_url)["specctl_reports_dropped_total"] == 10


def test_metrics_include_the_process_wide_registry(sidecar) -> None:
    names = {key.split("{")[0] for key in scrape(sidecar.metrics_url)}
    assert "specctl_policy_version" in names
    assert "python_info" in names


def test_a_settled_policy_is_republished_as_a_heartbeat(sidecar_factory) -> None:
    sidecar = sidecar_factory(policy_republish_interval_s=0.3)
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello("heartbeat-engine"))
        first = engine.recv_policy()
        again = engine.recv_policy(timeout=5.0)
        # Nothing changed, yet the same version arrives again, issued anew: the engine's
        # policy age resets.
        assert again.version == first.version
        assert again.issued_unix_s > first.issued_unix_s
        assert list(again.entries) == list(first.entries)
    finally:
        engine.close()


@dataclass
class _Reloadable:
    """A sidecar started from a configuration file, with one engine connected."""

    config: Path
    sidecar: SidecarThread
    engine: ScriptedEngine
    first: pb.Policy  # the policy the engine got on connecting

    def reload(self, text: str) -> None:
        """Rewrite the file and have the sidecar apply it now."""
        self.config.write_text(text)
        assert self.sidecar.run(self.sidecar.sidecar.reload_config) is True


@contextlib.contextmanager
def _reloadable(sidecar_factory, tmp_path: Path, text: str) -> Iterator[_Reloadable]:
    config = tmp_path / "specctl.toml"
    config.write_text(text)
    sidecar = sidecar_factory(config_path=config)
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello("reload-engine"))
        yield _Reloadable(config, sidecar, engine, engine.recv_policy())
    finally:
        engine.close()


def test_a_reloaded_republish_interval_takes_effect(sidecar_factory, tmp_path: Path) -> None:
    with _reloadable(sidecar_factory, tmp_path, "[policy]\nrepublish_interval_s = 3600\n") as r:
        r.reload("[policy]\nrepublish_interval_s = 0.3\n")
        # the heartbeat now comes every 0.3 s, not an hour after the last push
        again = r.engine.recv_policy(timeout=5.0)
        assert again.version == r.first.version
        assert again.issued_unix_s > r.first.issued_unix_s


def test_the_policy_learns_in_every_configured_load_bucket(sidecar_factory) -> None:
    # Five bounds: six buckets, more than the policy's own default of four.
    bounds = [2, 4, 8, 16, 64]
    sidecar = sidecar_factory(policy_load_bucket_bounds=bounds)
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello("buckets-engine"))
        first = engine.recv_policy()
        assert list(first.load_bucket_bounds) == bounds
        for seq in range(1, 4):
            engine.send(report(seq, workload_class="wide", load_bucket=5))
        newer = engine.recv_policy(min_version=first.version + 1)
        assert any(e.workload_class == "wide" and e.load_bucket == 5 for e in newer.entries)
        m = scrape(sidecar.metrics_url)
        assert "policy_error" not in str(m)
        assert not [k for k in m if k.startswith("specctl_internal_errors_total")]
    finally:
        engine.close()


class FailingUpdatePolicy(StaticPolicy):
    """A policy with a bug in its update: every report makes it raise."""

    def update_params(self, batch: StepBatch) -> None:
        raise RuntimeError("bug in update")


def test_a_policy_exception_is_an_internal_error_not_a_rejected_report() -> None:
    socket_dir = tempfile.mkdtemp(prefix="specctl-")
    overrides = {
        "server.listen": f"unix://{socket_dir}/s.sock",
        "server.metrics_listen": "127.0.0.1:0",
        "server.grace_period_s": 1.0,
        "log.format": "json",
    }
    config = load_config(None, env={}, overrides=overrides)
    try:
        with SidecarThread(config, policy=FailingUpdatePolicy(OFF)) as sc:
            engine = ScriptedEngine(sc.address)
            try:
                engine.send(hello())
                engine.recv_policy()
                errors = 'specctl_internal_errors_total{where="policy_update"}'
                for seq in (1, 2, 3):  # one learning round each: one exception each
                    engine.send(report(seq))
                    wait_for(lambda seq=seq: scrape(sc.metrics_url).get(errors) == seq)
                m = scrape(sc.metrics_url)
            finally:
                engine.close()
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    # the reports were valid: nothing feeds the rejection ratio or its alert
    assert m["specctl_reports_received_total"] == 3
    assert not [k for k in m if k.startswith("specctl_reports_rejected_total")]


def test_a_cached_policy_message_is_stamped_each_time_it_is_sent() -> None:
    now = [1000.0]
    book = PolicyBook(StaticPolicy(OFF), clock=lambda: now[0])
    messages = PolicyMessages(book.clock)
    first = messages.policy(book.full_policy())
    now[0] = 1010.0
    again = messages.policy(book.full_policy())
    assert (first.issued_unix_s, again.issued_unix_s) == (1000.0, 1010.0)
    assert again.version == first.version and list(again.entries) == list(first.entries)


def _learning(sidecar: SidecarThread) -> tuple[float, float, float]:
    """Reports received, learning rounds, and reports learned within a second of arriving."""
    m = scrape(sidecar.metrics_url)
    return (
        m["specctl_reports_received_total"],
        m["specctl_learning_rounds_total"],
        m['specctl_policy_update_latency_seconds_bucket{le="1.0"}'],
    )


def test_reports_within_the_learning_interval_are_learned_in_one_round(sidecar_factory) -> None:
    sidecar = sidecar_factory(policy_name="specctl", policy_learn_interval_s=6.0)
    engine = ScriptedEngine(sidecar.address)
    try:
        engine.send(hello("interval-engine"))
        engine.recv_policy()
        # after a quiet spell a report is learned at once
        engine.send(report(1))
        wait_for(lambda: _learning(sidecar)[1] == 1)
        for seq in (2, 3, 4, 5):
            engine.send(report(seq))
        wait_for(lambda: _learning(sidecar)[0] == 5)
        assert _learning(sidecar)[1] == 1  # the four wait for the interval to end
        wait_for(lambda: _learning(sidecar)[1] == 2, timeout=20.0)
        received, rounds, within_a_second = _learning(sidecar)
        assert (received, rounds, within_a_second) == (5, 2, 1)
        # all five reached the policy: each has one request row at ngram/k=4
        rounds_at_k4 = 'specctl_arm_rounds_total{arm="ngram/k=4",workload_class="chat"}'
        assert scrape(sidecar.metrics_url)[rounds_at_k4] == 5
    finally:
        engine.close()


def test_a_reloaded_learning_interval_ends_the_wait(sidecar_factory, tmp_path: Path) -> None:
    text = '[policy]\nname = "specctl"\nlearn_interval_s = {}\n'
    with _reloadable(sidecar_factory, tmp_path, text.format(60)) as r:
        r.engine.send(report(1))
        wait_for(lambda: _learning(r.sidecar)[1] == 1)
        r.engine.send(report(2))
        wait_for(lambda: _learning(r.sidecar)[0] == 2)
        assert _learning(r.sidecar)[1] == 1
        r.reload(text.format(0))
        # the waiting report is learned now, not a minute after the first
        wait_for(lambda: _learning(r.sidecar)[1] == 2)
