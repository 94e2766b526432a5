"""Sidecar configuration: defaults, file < environment < flags, errors that name key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from specctl.sidecar.config import ConfigError, load_config


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "specctl.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    c = load_config(env={})
    assert c.server.listen == "unix:///tmp/specctl.sock"
    assert c.server.socket_mode == "0600"
    assert c.server.metrics_listen == "127.0.0.1:9400"
    assert c.server.max_message_bytes == 4194304
    assert c.server.grace_period_s == 5.0
    assert c.server.max_engines == 256
    assert (c.policy.name, dict(c.policy.params)) == ("specctl", {})
    assert c.policy.republish_interval_s == 10.0
    assert c.policy.default_class == "default"
    assert c.policy.max_classes == 64
    assert c.policy.load_bucket_bounds == (8, 32, 128)
    assert c.policy.fallback_arm == ""
    assert c.policy.push_threshold == 0.05
    assert c.policy.min_push_interval_s == 0.5
    assert c.policy.learn_interval_s == 0.5
    assert (c.admin.enabled, c.admin.token_file) == (False, "")
    assert (c.log.format, c.log.level) == ("auto", "info")


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        '[server]\nlisten = "127.0.0.1:6000"\nmax_engines = 8\n'
        '[policy]\nname = "static"\nparams = { arm = "ngram/k=2" }\nload_bucket_bounds = [4, 16]\n'
        '[policy.overrides]\nchat = "off"\n'
        "[engine]\nmax_policy_age_s = 30\n",  # the engine plugin's section is left to it
    )
    env = {
        "SPECCTL_SERVER_LISTEN": "0.0.0.0:6001",
        "SPECCTL_POLICY_LOAD_BUCKET_BOUNDS": "2,64",
        "SPECCTL_ADMIN_ENABLED": "true",
        "SPECCTL_ENGINE_ADDRESS": "unix:///elsewhere.sock",  # not ours: ignored
        "HOME": "/root",
    }
    c = load_config(path, env=env, overrides={"server.listen": "[::1]:6002"})
    assert c.server.listen == "[::1]:6002"
    assert c.server.max_engines == 8
    assert c.policy.load_bucket_bounds == (2, 64)
    assert dict(c.policy.params) == {"arm": "ngram/k=2"}
    assert dict(c.policy.overrides) == {"chat": "off"}
    assert c.admin.enabled is True
    assert c.path == str(path)


def test_all_interfaces_only_when_written_out() -> None:
    assert load_config(env={"SPECCTL_SERVER_LISTEN": "0.0.0.0:50051"}).server.listen == (
        "0.0.0.0:50051"
    )
    with pytest.raises(ConfigError, match=r"server.listen=':50051'"):
        load_config(env={"SPECCTL_SERVER_LISTEN": ":50051"})


def test_a_policy_chosen_later_does_not_inherit_parameters_written_for_another(tmp_path) -> None:
    path = _file(tmp_path, '[policy]\nname = "static"\nparams = { arm = "ngram/k=2" }\n')
    c = load_config(path, env={}, overrides={"policy.name": "static"})
    assert dict(c.policy.params) == {"arm": "ngram/k=2"}  # same policy: kept


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[server]\nlisten = 5\n", {}, "server.listen=5: must be a string"),
        ('[server]\nlisten = "unix://relative.sock"\n', {}, "unix:///absolute/path"),
        ('[server]\nlistne = "x"\n', {}, "unknown key server.listne"),
        ('[sever]\nlisten = "x"\n', {}, "unknown section [sever]"),
        ('[server]\nsocket_mode = "0777"\n', {}, "server.socket_mode='0777'"),
        ('[server]\nmetrics_listen = "9400"\n', {}, "server.metrics_listen='9400'"),
        ("[server]\nmax_message_bytes = 10\n", {}, "server.max_message_bytes=10"),
        ("[server]\ngrace_period_s = -1\n", {}, "server.grace_period_s=-1.0"),
        ('[policy]\nname = "nope"\n', {}, "policy.name='nope': unknown policy"),
        (
            '[policy]\nname = "static"\nparams = { arm = "ngram/k=0" }\n',
            {},
            "policy.params={'arm': 'ngram/k=0'}",
        ),
        ('[policy]\nparams = { colour = "red" }\n', {}, "unknown parameters ['colour']"),
        ("[policy]\nload_bucket_bounds = [32, 8]\n", {}, "policy.load_bucket_bounds=[32, 8]"),
        ('[policy]\nload_bucket_bounds = ["a"]\n', {}, "must be a list of integers"),
        ("[policy]\npush_threshold = 2\n", {}, "policy.push_threshold=2.0"),
        ("[policy]\nlearn_interval_s = -0.5\n", {}, "policy.learn_interval_s=-0.5"),
        ('[policy]\nfallback_arm = "maybe"\n', {}, "policy.fallback_arm='maybe'"),
        ('[policy]\ndefault_class = ""\n', {}, "policy.default_class=''"),
        ("[policy]\nmax_classes = 0\n", {}, "policy.max_classes=0"),
        ('[policy.overrides]\nchat = "sometimes"\n', {}, "policy.overrides.chat='sometimes'"),
        ('[admin]\nenabled = "yes"\n', {}, "admin.enabled='yes': must be true or false"),
        ('[admin]\ntoken_file = "/nonexistent/token"\n', {}, "admin.token_file="),
        ('[log]\nformat = "xml"\n', {}, "log.format='xml'"),
        ('[log]\nlevel = "loud"\n', {}, "log.level='loud'"),
        ("not toml at all", {}, "is not valid TOML"),
        ("", {"SPECCTL_POLICY_PUSH_THRESHOLD": "lots"}, "SPECCTL_POLICY_PUSH_THRESHOLD='lots'"),
        ("", {"SPECCTL_SERVER_LISTN": "x"}, "SPECCTL_SERVER_LISTN: unknown key server.listn"),
        ("", {"SPECCTL_SERVER_MAX_ENGINES": "0"}, "server.max_engines=0"),
        ('[fleet]\nurl = "http://redis:6379"\n', {}, "fleet.url='http://redis:6379'"),
        ('[fleet]\nurl = "redis://"\n', {}, "needs a host"),
        ('[fleet]\nurl = "unix://relative.sock"\n', {}, "absolute socket path"),
        ('[fleet]\nurl = "redis://me:secret@redis:6379"\n', {}, "must not carry credentials"),
        ('[fleet]\nurl = "redis://redis:6379"\ntls_ca_file = "/etc/hostname"\n', {}, "rediss://"),
        ('[fleet]\npassword_file = "/nonexistent/password"\n', {}, "fleet.password_file="),
        ('[fleet]\nkey_prefix = "specctl:*"\n', {}, "fleet.key_prefix='specctl:*'"),
        ('[fleet]\npool = "a pool"\n', {}, "fleet.pool='a pool'"),
        ("[fleet]\npublish_interval_s = 1.0\nentry_ttl_s = 2.0\n", {}, "fleet.entry_ttl_s=2.0"),
        ("[fleet]\ntimeout_s = 0\n", {}, "fleet.timeout_s=0.0"),
        ("[fleet]\nmax_entry_bytes = 10\n", {}, "fleet.max_entry_bytes=10"),
    ],
)
def test_invalid_settings_name_key_and_value(tmp_path, text, env, message) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_file(tmp_path, text), env=env)
    assert message in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", env={})


def test_the_fleet_is_off_by_default_and_configured_by_url(tmp_path: Path) -> None:
    assert load_config(env={}).fleet.enabled is False
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    path = _file(
        tmp_path,
        '[fleet]\nurl = "rediss://valkey.ml.svc:6380/0"\nusername = "specctl"\n'
        f'password_file = "{password}"\ntls_ca_file = "{password}"\n',
    )
    env = {"SPECCTL_FLEET_SIDECAR_ID": "pod-0", "SPECCTL_FLEET_PUBLISH_INTERVAL_S": "0.5"}
    fleet = load_config(path, env=env).fleet
    assert fleet.enabled and fleet.url == "rediss://valkey.ml.svc:6380/0"
    assert (fleet.sidecar_id, fleet.publish_interval_s, fleet.entry_ttl_s) == ("pod-0", 0.5, 10.0)
    assert fleet.key_prefix == "specctl:fleet:" and fleet.pool == ""
    assert fleet.read_password() == "s3cret"
    password.write_text("\n")
    with pytest.raises(ConfigError, match=r"fleet\.password_file=.*is empty"):
        fleet.read_password()
