"""The Kubernetes manifests, checked offline.

Each layout is rendered the way kustomize would (resources and a ConfigMap
generator are all the kustomizations use; anything else fails the render),
then every resource is validated against the Kubernetes OpenAPI schemas that
kubernetes-validate ships, and the prometheus-operator resources against the
schema of the fields they use. The checks after that are about what the pods
must get right: the native sidecar, the ROCm settings, the probes, the engine
configuration (loaded with specctl's own config readers) and the wiring of
Services, ServiceMonitors and the PrometheusRule."""

from __future__ import annotations

import argparse
import ast
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deploy_support import DEPLOY, ROOT, RULES_FILE

from specctl.api import SERVICE_NAME
from specctl.engine.config import EngineConfig
from specctl.sidecar import serve_cli
from specctl.sidecar.config import load_config

K8S = DEPLOY / "k8s"
LAYOUTS = ("sidecar", "standalone", "fleet")
KUBERNETES_VERSION = "1.33.0"  # native sidecars are on by default from 1.29, GA in 1.33
KUSTOMIZE_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions"}

Resource = dict[str, Any]


def render(directory: Path) -> list[Resource]:
    """``kustomize build`` for the subset of kustomize these layouts use."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZE_KEYS
    assert not unknown, f"{directory}: kustomization fields this render does not do: {unknown}"
    out: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            out.extend(render(path))
        else:
            out.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    options = kustomization.get("generatorOptions", {})
    for generator in kustomization.get("configMapGenerator", []):
        assert options.get("disableNameSuffixHash") is True, "hash suffixes are not rendered"
        assert set(generator) <= {"name", "files"}, generator
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": {
                    Path(f).name: (directory / f).read_text() for f in generator.get("files", [])
                },
            }
        )
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, render(K8S / request.param)


def find(resources: list[Resource], kind: str, name: str) -> Resource:
    matches = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def containers(deployment: Resource) -> dict[str, Resource]:
    spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def env_of(container: Resource) -> dict[str, str]:
    """The container's environment written as values (not the variables taken from
    elsewhere: see resolved_env)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def resolved_env(container: Resource, resources: list[Resource], pod: str) -> dict[str, str]:
    """The environment as the kubelet sets it in pod ``pod``: values, the pod's fields,
    and ConfigMap keys (an optional key of a missing ConfigMap is left unset)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        source = e["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", source
            env[e["name"]] = pod
            continue
        ref = source["configMapKeyRef"]
        maps = [r for r in resources if r["kind"] == "ConfigMap"]
        found = [m for m in maps if m["metadata"]["name"] == ref["name"]]
        if found and ref["key"] in found[0]["data"]:
            env[e["name"]] = found[0]["data"][ref["key"]]
        else:
            assert ref.get("optional") is True, f"{e['name']}: {ref} does not exist"
    return env


# --- schemas for the prometheus-operator resources (monitoring.coreos.com/v1) -------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP},
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": _STR_MAP, "matchExpressions": {"type": "array"}},
    "additionalProperties": False,
}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)(y|w|d|h|m|s|ms))+)$"}
_RULE = {
    "type": "object",
    "required": ["expr"],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"type": ["string", "integer"]},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
    },
    "additionalProperties": False,
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "rules": {"type": "array", "items": _RULE},
                            },
                            "additionalProperties": False,
                        },
                    }
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "jobLabel": {"type": "string"},
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {"type": "object"},
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                                "scheme": {"enum": ["http", "https"]},
                            },
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
}


def test_render_reads_every_file_of_the_layout(layout: tuple[str, list[Resource]]) -> None:
    name, resources = layout
    kinds = sorted(r["kind"] for r in resources)
    expected = ["ConfigMap", "Deployment", "PrometheusRule", "Service", "Service"]
    expected += ["ServiceMonitor", "ServiceMonitor"]
    if name == "standalone":
        expected += ["Deployment", "NetworkPolicy", "PersistentVolumeClaim"]
    if name == "fleet":
        expected += ["ConfigMap"]  # where the sidecars share evidence
    assert kinds == sorted(expected)


def test_resources_validate_against_their_schemas(layout: tuple[str, list[Resource]]) -> None:
    _, resources = layout
    for resource in resources:
        kind = resource["kind"]
        if kind in CRD_SCHEMAS:
            jsonschema.validate(resource, CRD_SCHEMAS[kind])
        else:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_schema_validation_rejects_mistakes(layout: tuple[str, list[Resource]]) -> None:
    """The validators are not vacuous: a misspelt field fails each of them."""
    _, resources = layout
    deployment = find(resources, "Deployment", "vllm")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    monitor = find(resources, "ServiceMonitor", "specctl")
    broken = yaml.safe_load(yaml.safe_dump(monitor))
    broken["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, CRD_SCHEMAS["ServiceMonitor"])


def test_vllm_pod_has_what_rocm_needs(layout: tuple[str, list[Resource]]) -> None:
    _, resources = layout
    deployment = find(resources, "Deployment", "vllm")
    pod = deployment["spec"]["template"]["spec"]
    vllm = containers(deployment)["vllm"]
    assert vllm["resources"]["limits"]["amd.com/gpu"] >= 1
    assert pod["securityContext"]["seccompProfile"]["type"] == "Unconfined"
    assert "SYS_PTRACE" in vllm["securityContext"]["capabilities"]["add"]
    assert 44 in pod["securityContext"]["supplementalGroups"]  # video
    shm = next(m for m in vllm["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert vllm["image"].startswith("specctl-vllm-rocm:")


def test_vllm_runs_the_specctl_scheduler(layout: tuple[str, list[Resource]]) -> None:
    _, resources = layout
    vllm = containers(find(resources, "Deployment", "vllm"))["vllm"]
    args = dict(a.split("=", 1) for a in vllm["args"] if a.startswith("--") and "=" in a)
    module, _, cls = args["--scheduler-cls"].rpartition(".")
    package, _, rest = module.partition(".")
    assert package == "specctl", args["--scheduler-cls"]
    source = (ROOT / "controller" / (rest.replace(".", "/") + ".py")).read_text()
    classes = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
    assert cls in classes, f"{args['--scheduler-cls']} does not exist"
    assert yaml.safe_load(args["--speculative-config"])["num_speculative_tokens"] >= 1


def test_engine_configuration_loads(layout: tuple[str, list[Resource]], tmp_path: Path) -> None:
    """What the engine plugin reads in the pod: the env and the ConfigMap's [engine]."""
    name, resources = layout
    toml = find(resources, "ConfigMap", "specctl-config")["data"]["specctl.toml"]
    vllm = containers(find(resources, "Deployment", "vllm"))["vllm"]
    env = env_of(vllm)
    mount = next(m for m in vllm["volumeMounts"] if m["name"] == "specctl-config")
    assert env["SPECCTL_CONFIG"] == f"{mount['mountPath']}/specctl.toml"
    (tmp_path / "specctl.toml").write_text(toml)
    config = EngineConfig.load({**env, "SPECCTL_CONFIG": str(tmp_path / "specctl.toml")})
    assert config.address == env["SPECCTL_ADDRESS"]
    assert config.fallback_arm == env["SPECCTL_FALLBACK_ARM"]
    assert config.max_policy_age_s == float(env["SPECCTL_MAX_POLICY_AGE_S"])
    if name == "standalone":
        service = find(resources, "Service", "specctl")
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert config.address == f"dns:///specctl:{port}"


def _sidecar_config(container: Resource, toml: str, tmp_path: Path) -> Any:
    """specctl's configuration as ``specctl serve`` would load it in the container."""
    (tmp_path / "specctl.toml").write_text(toml)
    command, *args = [a.replace("/etc/specctl/", f"{tmp_path}/") for a in container["args"]]
    assert command == "serve"
    parser = argparse.ArgumentParser(prog="specctl serve", exit_on_error=False)
    serve_cli.add_arguments(parser)
    parsed = parser.parse_args(args)
    return load_config(parsed.config, env={}, overrides=serve_cli.flag_overrides(parsed))


def test_sidecar_configuration_loads(layout: tuple[str, list[Resource]], tmp_path: Path) -> None:
    name, resources = layout
    toml = find(resources, "ConfigMap", "specctl-config")["data"]["specctl.toml"]
    owner = "specctl" if name == "standalone" else "vllm"
    specctl = containers(find(resources, "Deployment", owner))["specctl"]
    config = _sidecar_config(specctl, toml, tmp_path)
    assert config.server.metrics_listen == "0.0.0.0:9400"
    assert config.policy.fallback_arm
    # learned state goes to a volume (the root file system is read-only)
    mounts = {m["mountPath"]: m for m in specctl["volumeMounts"]}
    assert config.state.dir in mounts and not mounts[config.state.dir].get("readOnly")
    if name != "standalone":
        # the engine dials the socket the sidecar listens on, in a volume both mount
        vllm = containers(find(resources, "Deployment", "vllm"))["vllm"]
        assert env_of(vllm)["SPECCTL_ADDRESS"] == config.server.listen
        socket_dir = str(Path(config.server.listen.removeprefix("unix://")).parent)
        mounts = [{m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in (specctl, vllm)]
        assert mounts[0][socket_dir] == mounts[1][socket_dir]
    else:
        assert config.server.listen == "0.0.0.0:50051"


def test_sidecar_container_probes_and_hardening(layout: tuple[str, list[Resource]]) -> None:
    name, resources = layout
    if name != "standalone":
        deployment = find(resources, "Deployment", "vllm")
        init = deployment["spec"]["template"]["spec"]["initContainers"]
        assert [c["name"] for c in init] == ["specctl"]
        specctl = init[0]
        assert specctl["restartPolicy"] == "Always"  # a native sidecar
        listen = next(a for a in specctl["args"] if a.startswith("--listen="))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = specctl[probe]["exec"]["command"]
            assert command[0] == "specctl-health", shlex.join(command)
            assert command[1] == listen.removeprefix("--listen=")
        service = next(a for a in specctl["readinessProbe"]["exec"]["command"] if "service" in a)
        assert service == f"--service={SERVICE_NAME}"
    else:
        deployment = find(resources, "Deployment", "specctl")
        assert deployment["spec"]["replicas"] == 1
        specctl = containers(deployment)["specctl"]
        grpc_port = next(p for p in specctl["ports"] if p["name"] == "grpc")["containerPort"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert specctl[probe]["grpc"]["port"] == grpc_port
        assert specctl["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    assert specctl["image"].startswith("specctl:")
    context = specctl["securityContext"]
    pod_context = deployment["spec"]["template"]["spec"].get("securityContext", {})
    assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]


def test_services_and_monitors_select_what_exists(layout: tuple[str, list[Resource]]) -> None:
    _, resources = layout
    pods = [d for d in resources if d["kind"] == "Deployment"]
    services = [s for s in resources if s["kind"] == "Service"]
    for service in services:
        selector = service["spec"]["selector"]
        selected = [
            d
            for d in pods
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        names = {p["name"] for d in selected for c in containers(d).values() for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names, (service["metadata"]["name"], port)
    jobs = set()
    for monitor in (r for r in resources if r["kind"] == "ServiceMonitor"):
        spec = monitor["spec"]
        matched = [
            s
            for s in services
            if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert matched, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for service in matched:
            ports = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in spec["endpoints"]} <= ports
            jobs.add(service["metadata"]["labels"][spec["jobLabel"]])
    # the alerting rules look for job="specctl"
    assert jobs == {"specctl", "vllm"}


def test_prometheus_rule_carries_the_rules_file(layout: tuple[str, list[Resource]]) -> None:
    _, resources = layout
    rule = find(resources, "PrometheusRule", "specctl")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_the_fleet_layout_shares_through_an_existing_store(tmp_path: Path) -> None:
    """Each replica's sidecar, as configured in its pod: sharing through the store the
    ConfigMap names, with the password and CA of the Secret, under the pod's name; the
    sidecar layout alone does not share."""
    resources = render(K8S / "fleet")
    vllm = find(resources, "Deployment", "vllm")
    specctl = containers(vllm)["specctl"]
    toml = find(resources, "ConfigMap", "specctl-config")["data"]["specctl.toml"]
    env = resolved_env(specctl, resources, pod="vllm-7d9f8b6c4-x2k8q")
    # the Secret's files where the container mounts it (test files stand in for them)
    mount = next(m for m in specctl["volumeMounts"] if m["name"] == "specctl-fleet")
    assert mount["readOnly"] is True
    volume = next(
        v for v in vllm["spec"]["template"]["spec"]["volumes"] if v["name"] == "specctl-fleet"
    )
    assert volume["secret"]["secretName"] == "specctl-fleet"
    for key in ("SPECCTL_FLEET_PASSWORD_FILE", "SPECCTL_FLEET_TLS_CA_FILE"):
        assert env[key].startswith(mount["mountPath"] + "/"), key
        local = tmp_path / Path(env[key]).name
        local.write_text("from the Secret\n")
        env[key] = str(local)
    (tmp_path / "specctl.toml").write_text(toml)
    fleet = load_config(tmp_path / "specctl.toml", env=env).fleet
    assert fleet.enabled and fleet.url.startswith("rediss://")
    assert fleet.sidecar_id == "vllm-7d9f8b6c4-x2k8q"
    assert fleet.read_password() == "from the Secret"
    # without the ConfigMap (the sidecar layout), the optional references stay unset
    alone = render(K8S / "sidecar")
    env = resolved_env(containers(find(alone, "Deployment", "vllm"))["specctl"], alone, pod="p")
    assert "SPECCTL_FLEET_URL" not in env
    assert load_config(tmp_path / "specctl.toml", env=env).fleet.enabled is False
