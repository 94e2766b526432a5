"""Admin calls: off by default, bearer token when configured, overrides pushed to engines."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from specctl.api import pb, pb_grpc
from specctl.cli import main
from specctl.testing.scripted_engine import ScriptedEngine, hello, scrape


def _admin(address: str) -> tuple[grpc.Channel, pb_grpc.SpecControllerAdminStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.SpecControllerAdminStub(channel)


def test_admin_is_disabled_by_default(sidecar) -> None:
    channel, admin = _admin(sidecar.address)
    with channel:
        for call, request in (
            (admin.SetOverride, pb.SetOverrideRequest(workload_class="chat", arm="off")),
            (admin.ResetClass, pb.ResetClassRequest(workload_class="default")),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=5)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert info.value.details() == "admin calls are disabled; set admin.enabled"
    assert sidecar.run(lambda: sidecar.sidecar.book.overrides) == {}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text("s3cret-token\n")
    return path


def test_override_with_token_pins_the_class_and_is_pushed(sidecar_factory, token_file) -> None:
    sc = sidecar_factory(
        "tcp",
        admin_enabled=True,
        admin_token_file=str(token_file),
        policy_name="static",
        policy_params={"arm": "ngram/k=4"},
    )
    engine = ScriptedEngine(sc.address)
    channel, admin = _admin(sc.address)
    try:
        engine.send(hello())
        first = engine.recv_policy()
        request = pb.SetOverrideRequest(workload_class="chat", arm="off")
        for metadata in (
            (),
            (("authorization", "Bearer wrong"),),
            (("authorization", "s3cret-token"),),
        ):
            with pytest.raises(grpc.RpcError) as info:
                admin.SetOverride(request, metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer <token>" in (info.value.details() or "")

        good = (("authorization", "Bearer s3cret-token"),)
        response = admin.SetOverride(request, metadata=good, timeout=5)
        assert response.policy_version > first.version
        pushed = engine.recv_policy(min_version=response.policy_version)
        chat = [e for e in pushed.entries if e.workload_class == "chat"]
        assert len(chat) == 4
        assert all(list(e.arms) == ["off"] for e in chat)
        assert all(e.explanation == "pinned by operator: off" for e in chat)
        assert (
            scrape(sc.metrics_url)['specctl_speculation_off{load_bucket="0",workload_class="chat"}']
            == 1
        )

        evidence = pb_grpc.SpecControllerStub(channel).GetEvidence(
            pb.GetEvidenceRequest(workload_class="chat"), timeout=5
        )
        assert {c.override_arm for c in evidence.classes} == {"off"}

        with pytest.raises(grpc.RpcError) as info:
            admin.SetOverride(
                pb.SetOverrideRequest(workload_class="chat", arm="ngram/k=99"),
                metadata=good,
                timeout=5,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "k=99" in (info.value.details() or "")

        cleared = admin.SetOverride(
            pb.SetOverrideRequest(workload_class="chat", arm=""), metadata=good, timeout=5
        )
        pushed = engine.recv_policy(min_version=cleared.policy_version)
        assert all(list(e.arms) == ["ngram/k=4"] for e in pushed.entries)

        reset = admin.ResetClass(pb.ResetClassRequest(workload_class="chat"), metadata=good)
        assert reset.policy_version > cleared.policy_version
        with pytest.raises(grpc.RpcError) as info:
            admin.ResetClass(pb.ResetClassRequest(workload_class="never-seen"), metadata=good)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        engine.close()
        channel.close()


def test_override_command(sidecar_factory, token_file, capsys) -> None:
    sc = sidecar_factory(admin_enabled=True, admin_token_file=str(token_file))
    assert main(["override", "--address", sc.address, "chat", "off"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    args = ["override", "--address", sc.address, "--token-file", str(token_file)]
    assert main([*args, "chat", "off"]) == 0
    assert "chat: pinned to off" in capsys.readouterr().out
    assert sc.run(lambda: {c: a.name for c, a in sc.sidecar.book.overrides.items()}) == {
        "chat": "off"
    }
    assert main([*args, "chat", "--clear"]) == 0
    assert sc.run(lambda: sc.sidecar.book.overrides) == {}
    assert main([*args, "chat"]) == 2


def test_every_admin_method_is_unary_so_the_interceptor_guards_it() -> None:
    # AdminAuthInterceptor wraps unary handlers and refuses any other kind outright
    service = pb.DESCRIPTOR.services_by_name["SpecControllerAdmin"]
    assert [m.name for m in service.methods] == ["SetOverride", "ResetClass"]
    for method in service.methods:
        assert not method.client_streaming and not method.server_streaming, method.name
