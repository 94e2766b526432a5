"""Security: default bind, TLS and mutual TLS with reload, admin by token or client certificate.

Certificates (a CA, the server's, clients') are generated with ``cryptography``
(:mod:`pki_support`).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from pki_support import Pem, issue, make_ca

from specctl.api import pb, pb_grpc
from specctl.sidecar.config import ConfigError, ServerConfig, load_config
from specctl.testing.scripted_engine import hello, report, scrape, wait_for


@dataclass
class Pki:
    dir: Path
    ca: Pem
    other_ca: Pem
    server: Pem
    engine: Pem
    operator: Pem
    stranger: Pem  # signed by another CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key, ca_cert = make_ca("specctl test CA")
    other, other_key, other_cert = make_ca("someone else's CA")
    p = Pki(
        dir=d,
        ca=ca,
        other_ca=other,
        server=issue(ca_key, ca_cert, "specctl-sidecar", server=True),
        engine=issue(ca_key, ca_cert, "engine-1", server=False),
        operator=issue(ca_key, ca_cert, "ops-admin", server=False),
        stranger=issue(other_key, other_cert, "ops-admin", server=False),
    )
    (d / "ca.pem").write_bytes(ca.cert)
    (d / "server.pem").write_bytes(p.server.cert)
    (d / "server.key").write_bytes(p.server.key)
    os.chmod(d / "server.key", 0o600)
    return p


def mutual_tls(pki: Pki) -> dict[str, str]:
    """The sidecar settings for mutual TLS with the test PKI."""
    return {
        "server_tls_cert_file": str(pki.dir / "server.pem"),
        "server_tls_key_file": str(pki.dir / "server.key"),
        "server_tls_client_ca_file": str(pki.dir / "ca.pem"),
    }


def channel(address: str, ca: bytes, client: Pem | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    return grpc.secure_channel(address, creds)


def get_policy(ch: grpc.Channel) -> pb.Policy:
    return pb_grpc.SpecControllerStub(ch).GetPolicy(pb.GetPolicyRequest(), timeout=5)


def test_default_bind_is_a_private_unix_socket(sidecar) -> None:
    assert ServerConfig().listen.startswith("unix://")
    assert ServerConfig().metrics_listen.startswith("127.0.0.1:")
    path = sidecar.address.removeprefix("unix://")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert stat.S_ISSOCK(os.stat(path).st_mode) and mode == 0o600


def test_group_socket_mode(sidecar_factory) -> None:
    sc = sidecar_factory("unix", server_socket_mode="0660")
    assert stat.S_IMODE(os.stat(sc.address.removeprefix("unix://")).st_mode) == 0o660


def test_tls_serves_and_refuses_plaintext(sidecar_factory, pki: Pki) -> None:
    sc = sidecar_factory(
        "tcp",
        server_tls_cert_file=str(pki.dir / "server.pem"),
        server_tls_key_file=str(pki.dir / "server.key"),
    )
    with channel(sc.address, pki.ca.cert) as ch:
        assert get_policy(ch).version >= 1
    with grpc.insecure_channel(sc.address) as ch, pytest.raises(grpc.RpcError) as info:
        get_policy(ch)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with channel(sc.address, pki.other_ca.cert) as ch, pytest.raises(grpc.RpcError) as info:
        get_policy(ch)  # a server the client's CA did not sign
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_ca(sidecar_factory, pki: Pki) -> None:
    sc = sidecar_factory(
        "tcp",
        **mutual_tls(pki),
    )
    with channel(sc.address, pki.ca.cert, pki.engine) as ch:
        assert get_policy(ch).version >= 1
        # a full engine stream over mTLS
        stub = pb_grpc.SpecControllerStub(ch)
        call = stub.Connect(iter([hello(), pb.EngineMessage(report=report(1))]), timeout=5)
        first = next(iter(call))
        assert first.WhichOneof("kind") == "policy"
        call.cancel()
    for client in (None, pki.stranger):
        with channel(sc.address, pki.ca.cert, client) as ch, pytest.raises(grpc.RpcError) as info:
            get_policy(ch)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificates_are_reloaded_when_the_files_change(sidecar_factory, pki: Pki) -> None:
    certs = pki.dir / "rotating"
    certs.mkdir(exist_ok=True)
    first_ca, first_key, first_cert = make_ca("first CA")
    first = issue(first_key, first_cert, "specctl-sidecar", server=True)
    (certs / "server.pem").write_bytes(first.cert)
    (certs / "server.key").write_bytes(first.key)
    sc = sidecar_factory(
        "tcp",
        server_tls_cert_file=str(certs / "server.pem"),
        server_tls_key_file=str(certs / "server.key"),
    )
    with channel(sc.address, first_ca.cert) as ch:
        assert get_policy(ch).version >= 1
    # rotate to a certificate from the test PKI: new connections get it
    time.sleep(0.01)
    (certs / "server.key").write_bytes(pki.server.key)
    (certs / "server.pem").write_bytes(pki.server.cert)
    with channel(sc.address, pki.ca.cert) as ch:
        assert get_policy(ch).version >= 1
    with channel(sc.address, first_ca.cert) as ch, pytest.raises(grpc.RpcError):
        get_policy(ch)
    assert sc.sidecar.tls is not None and sc.sidecar.tls.reloads == 1
    # a broken rotation keeps the certificate in use
    (certs / "server.pem").write_bytes(b"half-written")
    with channel(sc.address, pki.ca.cert) as ch:
        assert get_policy(ch).version >= 1


def _admin_call(ch: grpc.Channel, token: str | None = None) -> pb.SetOverrideResponse:
    metadata = [("authorization", f"Bearer {token}")] if token else None
    return pb_grpc.SpecControllerAdminStub(ch).SetOverride(
        pb.SetOverrideRequest(workload_class="chat", arm="off"), metadata=metadata, timeout=5
    )


def test_admin_by_client_certificate_or_token(sidecar_factory, pki: Pki, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    sc = sidecar_factory(
        "tcp",
        **mutual_tls(pki),
        admin_enabled=True,
        admin_token_file=str(token),
        admin_client_cns="ops-admin, oncall",
    )
    # the operator's certificate is enough
    with channel(sc.address, pki.ca.cert, pki.operator) as ch:
        assert _admin_call(ch).policy_version > 0
    # an engine's certificate is not ...
    with channel(sc.address, pki.ca.cert, pki.engine) as ch:
        with pytest.raises(grpc.RpcError) as info:
            _admin_call(ch)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "admin.client_cns" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            _admin_call(ch, "wrong")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # ... unless it carries the token
        assert _admin_call(ch, "s3cret-token").policy_version > 0


def test_admin_enabled_without_credentials_refuses_everyone(sidecar_factory) -> None:
    sc = sidecar_factory("unix", admin_enabled=True)
    with grpc.insecure_channel(sc.address) as ch, pytest.raises(grpc.RpcError) as info:
        _admin_call(ch)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tls_settings_are_checked(pki: Pki) -> None:
    cert, key = str(pki.dir / "server.pem"), str(pki.dir / "server.key")
    with pytest.raises(ConfigError, match="needs both"):
        load_config(
            env={}, overrides={"server.listen": "127.0.0.1:0", "server.tls_cert_file": cert}
        )
    with pytest.raises(ConfigError, match=r"server\.tls_client_ca_file"):
        load_config(env={}, overrides={"server.tls_client_ca_file": cert})
    with pytest.raises(ConfigError, match="unix sockets"):
        load_config(env={}, overrides={"server.tls_cert_file": cert, "server.tls_key_file": key})
    with pytest.raises(ConfigError, match=r"admin\.client_cns"):
        load_config(env={}, overrides={"admin.client_cns": "ops"})
    with pytest.raises(ConfigError, match="not a readable file"):
        load_config(
            env={},
            overrides={
                "server.listen": "127.0.0.1:0",
                "server.tls_cert_file": "/nonexistent.pem",
                "server.tls_key_file": key,
            },
        )


def test_report_flood_from_one_engine_is_rate_limited(sidecar_factory) -> None:
    from specctl.testing.scripted_engine import ScriptedEngine

    sc = sidecar_factory("unix", server_max_reports_per_s=5.0)
    engine = ScriptedEngine(sc.address)
    try:
        engine.send(hello())
        engine.recv_policy()
        for seq in range(1, 41):
            engine.send(report(seq))
        rejected = engine.recv_rejection()
        assert rejected.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "server.max_reports_per_s=5" in rejected.message
        wait_for(lambda: scrape(sc.metrics_url)["specctl_reports_received_total"] == 40)
        limited = 'specctl_reports_rejected_total{reason="rate_limited"}'
        # a burst of 5, then 5 per second: most of the 40 sent at once are refused
        assert scrape(sc.metrics_url).get(limited, 0) >= 20
        # the stream goes on: a report after the bucket refills is learned from
        time.sleep(1.0)
        engine.send(report(41))
        wait_for(lambda: scrape(sc.metrics_url)["specctl_reports_received_total"] == 41)
        assert engine.error is None
    finally:
        engine.close()


def test_the_engine_client_connects_over_mutual_tls(sidecar_factory, pki: Pki) -> None:
    from specctl.arms import parse_arm
    from specctl.engine.client import SidecarClient
    from specctl.engine.config import ConfigError as EngineConfigError
    from specctl.engine.config import EngineConfig

    sc = sidecar_factory(
        "tcp",
        **mutual_tls(pki),
    )
    (pki.dir / "engine.pem").write_bytes(pki.engine.cert)
    (pki.dir / "engine.key").write_bytes(pki.engine.key)
    env = {
        "SPECCTL_ADDRESS": sc.address,
        "SPECCTL_TLS_CA_FILE": str(pki.dir / "ca.pem"),
        "SPECCTL_TLS_CERT_FILE": str(pki.dir / "engine.pem"),
        "SPECCTL_TLS_KEY_FILE": str(pki.dir / "engine.key"),
        "SPECCTL_ENGINE_ID": "engine-tls",
    }
    config = EngineConfig.load(env)
    hello = pb.Hello(
        engine_id="engine-tls",
        drafters=[pb.Drafter(method="ngram", max_k=4)],
        fallback_arm="off",
    )
    client = SidecarClient(config, hello, {"ngram": 4}, parse_arm("off"))
    client.start()
    try:
        wait_for(lambda: client.state().policy_version > 0, timeout=20)
        assert client.state().connected
    finally:
        client.close()
    # without its certificate the engine cannot connect, and stays in fallback
    no_cert = EngineConfig.load({**env, "SPECCTL_TLS_CERT_FILE": "", "SPECCTL_TLS_KEY_FILE": ""})
    client = SidecarClient(no_cert, hello, {"ngram": 4}, parse_arm("off"))
    client.start()
    try:
        time.sleep(1.0)
        assert client.state().policy_version == 0 and not client.state().connected
    finally:
        client.close()
    with pytest.raises(EngineConfigError, match="go together"):
        EngineConfig.load({**env, "SPECCTL_TLS_KEY_FILE": ""})


def test_the_client_commands_reach_a_mutual_tls_sidecar(
    sidecar_factory, pki: Pki, tmp_path: Path, capsys
) -> None:
    from specctl.cli import main

    sc = sidecar_factory(
        "tcp",
        **mutual_tls(pki),
        admin_enabled=True,
        admin_client_cns="ops-admin",
    )
    for who, pem in (("operator", pki.operator), ("engine", pki.engine)):
        (tmp_path / f"{who}.pem").write_bytes(pem.cert)
        (tmp_path / f"{who}.key").write_bytes(pem.key)

    def tls(who: str) -> list[str]:
        return [
            "--address",
            sc.address,
            "--tls-ca-file",
            str(pki.dir / "ca.pem"),
            "--tls-cert-file",
            str(tmp_path / f"{who}.pem"),
            "--tls-key-file",
            str(tmp_path / f"{who}.key"),
        ]

    # the documented admin path: the operator's client certificate, no token
    assert main(["override", *tls("operator"), "chat", "off"]) == 0
    assert "chat: pinned to off" in capsys.readouterr().out
    assert sc.run(lambda: {c: a.name for c, a in sc.sidecar.book.overrides.items()}) == {
        "chat": "off"
    }
    assert main(["policy", *tls("engine")]) == 0
    assert "chat" in capsys.readouterr().out
    assert main(["evidence", *tls("engine"), "--class", "chat"]) == 0
    assert "[override off]" in capsys.readouterr().out
    # an engine's certificate reads, but may not pin
    assert main(["override", *tls("engine"), "chat", "--clear"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    # without a client certificate the handshake fails; a lone certificate is a usage error
    assert main(["policy", "--address", sc.address, "--tls-ca-file", str(pki.dir / "ca.pem")]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    lone = ["--tls-cert-file", str(tmp_path / "operator.pem")]
    assert main(["policy", "--address", sc.address, *lone]) == 2
    assert "--tls-cert-file and --tls-key-file go together" in capsys.readouterr().err
