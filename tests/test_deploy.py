"""The deployment: the Dockerfile (linted, its last stage's command run as a plain process) and
the Helm chart (rendered by real Helm, every object checked against Kubernetes' schemas and
against the gateway it runs). No Docker engine and no cluster run here: see docs/deploy.md,
"What is tested". The tools: tests/deploy_tools.py."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from llmroute._config import load_config, load_keys_file, resolve
from tests.deploy_tools import (
    DOCKERFILE,
    Rendered,
    chart_values,
    hadolint,
    helm_render,
    image,
    merged,
)

KUBERNETES = ("1.29.0", "1.37.0")  # the oldest and newest schemas checked
REDIS_URL = "redis://:pw-7c1e@redis.example:6379/0"
VALID = {"redis": {"url": REDIS_URL}, "secrets": {"env": {"LLMROUTE_GATEWAY_KEY": "gw-test"}}}


# --- the Dockerfile ----------------------------------------------------------------------------


def test_dockerfile_lints_clean_with_hadolint() -> None:
    proc = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_dockerfile_builds_a_wheel_and_runs_it_as_a_non_root_user() -> None:
    built = image()
    assert len(built.stages) == 2
    build, runtime = built.stages
    assert "AS build" in build.splitlines()[0] and "python -m build --wheel" in build
    assert "pip wheel" in build and "[server,redis]" in build
    # The runtime stage installs the build stage's wheels only: no source tree, no compiler.
    assert "--no-index" in runtime and "from=build,source=/wheels" in runtime
    assert not re.search(r"(?m)^COPY (?!--from)", runtime)
    assert not re.search(r"\b(gcc|build-essential|apt-get install)\b", runtime)
    uid, _, gid = built.user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    assert built.entrypoint == ["llmroute", "serve"]
    assert built.cmd[:2] == ["--host", "0.0.0.0"]
    assert built.env["LLMROUTE_CONFIG"] == "/etc/llmroute/config/llmroute.toml"
    assert built.env["LLMROUTE_HEALTH_URL"].endswith("/health")
    assert "LLMROUTE_HEALTH_URL" in " ".join(built.healthcheck)


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    ignore = (DOCKERFILE.parent / ".dockerignore").read_text().splitlines()
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = set()
    for line in image().stages[0].splitlines():
        if line.startswith("COPY "):
            copied.update(part.strip("./") for part in line.split()[1:-1])
    assert "*" in ignore and kept == copied == {
        "pyproject.toml",
        "README.md",
        "providers",
        "llmroute",
    }


# --- the chart, rendered by Helm -----------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return helm_render(tmp_path_factory.mktemp("chart"), VALID)


def _validate(chart: Rendered) -> None:
    for (kind, name), obj in chart.objects.items():
        for version in KUBERNETES:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{kind} {name} on Kubernetes {version}: {exc}") from None


def test_helm_lints_the_chart_without_a_warning(rendered: Rendered) -> None:
    assert rendered.helm_version.startswith("helm-sdkpy-"), rendered.helm_version
    assert [m for m in rendered.messages if m["Severity"] >= 2] == []
    assert rendered.fails == []  # none of the chart's own checks refused these values
    assert rendered.kinds() == [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Service",
    ]


def test_every_object_is_valid_for_kubernetes(rendered: Rendered) -> None:
    _validate(rendered)
    for obj in rendered.objects.values():
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"]
        assert len(obj["metadata"]["name"]) <= 63


def _container(chart: Rendered) -> dict[str, Any]:
    (container,) = chart.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def test_the_deployment_serves_and_probes_the_gateway(rendered: Rendered) -> None:
    deployment = rendered.one("Deployment")
    spec = deployment["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    container = _container(rendered)
    assert container["image"] == "registry.example.com/llmroute:0.1.0"  # appVersion by default
    port = rendered.values["gateway"]["port"]
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert container["args"][container["args"].index("--port") + 1] == str(port)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    service = rendered.one("Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    hpa = rendered.one("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in spec  # the HPA owns them
    assert container["resources"]["requests"]["cpu"]  # what CPU utilization is a share of


def test_the_grace_period_covers_the_prestop_sleep_and_the_gateway_shutdown(
    rendered: Rendered,
) -> None:
    from llmroute.server import _run

    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    command = _container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = int(command[1])
    assert pre_stop == rendered.values["drain"]["preStopSeconds"] > 0
    # After the hook, SIGTERM: the gateway's own shutdown waits at most _GRACE for connections.
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + _run._GRACE + 5


def test_pods_run_unprivileged_on_a_read_only_root(rendered: Rendered) -> None:
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    container = _container(rendered)
    built = image()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == built.user.split(":")[0]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    # What the gateway writes (the disk cache under XDG_CACHE_HOME, temporary files) is on
    # emptyDir volumes; what it reads is where the image's environment says.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (built.env["XDG_CACHE_HOME"], "/tmp"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    config_path = Path(built.env["LLMROUTE_CONFIG"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LLMROUTE_CONFIG"] == str(config_path)
    config_mount = mounts[str(config_path.parent)]
    assert config_mount["readOnly"] is True
    config_map = volumes[config_mount["name"]]["configMap"]["name"]
    assert config_path.name in rendered.objects[("ConfigMap", config_map)]["data"]


def test_the_config_and_keys_the_chart_mounts_load_as_the_gateway_loads_them(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (text,) = rendered.one("ConfigMap")["data"].values()
    env_secret = rendered.objects[("Secret", "test-release-llmroute-env")]["stringData"]
    assert env_secret["LLMROUTE_REDIS_URL"] == REDIS_URL  # never in the ConfigMap
    assert "pw-7c1e" not in json.dumps(rendered.one("ConfigMap"))
    monkeypatch.setenv("LLMROUTE_REDIS_URL", env_secret["LLMROUTE_REDIS_URL"])
    path = tmp_path / "llmroute.toml"
    path.write_text(text)
    config = load_config(path)
    assert config is not None and config.redis.url.get_secret_value() == REDIS_URL
    assert config.gateway is not None and config.gateway.limits_backend == "redis"
    environ = {"DEEPSEEK_API_KEY": "x", "OPENAI_API_KEY": "y"}
    assert set(resolve(config, environ=environ).routes) == {"chat"}
    # The keys file is where the config says, in the Secret mounted there.
    keys_path = Path(tomllib.loads(text)["gateway"]["keys_file"])
    mounts = {m["mountPath"]: m["name"] for m in _container(rendered)["volumeMounts"]}
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[str(keys_path.parent)])
    keys = rendered.objects[("Secret", volume["secret"]["secretName"])]["stringData"]
    (tmp_path / keys_path.name).write_text(keys[keys_path.name])
    monkeypatch.setenv("LLMROUTE_GATEWAY_KEY", env_secret["LLMROUTE_GATEWAY_KEY"])
    assert load_keys_file(str(tmp_path / keys_path.name), config)


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({"redis": {"url": ""}}, "redis.url (or redis.existingSecret) is required"),
        ({"keysFile": ""}, "keysFile is required"),
        (
            {"drain": {"preStopSeconds": 30, "terminationGracePeriodSeconds": 35}},
            "drain.terminationGracePeriodSeconds must be at least drain.preStopSeconds + 10",
        ),
    ],
)
def test_the_chart_refuses_values_that_cannot_run(
    tmp_path: Path, overrides: dict[str, Any], refused: str
) -> None:
    chart = helm_render(tmp_path, merged(VALID, overrides))
    assert any(refused in text for text in chart.fails), chart.fails


def test_other_values_render_valid_objects(tmp_path: Path) -> None:
    """One replica count without the HPA or the PDB, the operator's own Secrets, no keys file,
    a pinned tag and extra arguments."""
    config = chart_values()["config"].replace('keys_file = "/etc/llmroute/keys/keys.toml"', "")
    chart = helm_render(
        tmp_path,
        {
            "config": config,
            "keysFile": "",
            "replicaCount": 2,
            "autoscaling": {"enabled": False},
            "podDisruptionBudget": {"enabled": False},
            "secrets": {"existingSecret": "gateway-env"},
            "redis": {"url": "", "existingSecret": "redis-auth"},
            "image": {"tag": "0.1.0-3-gabc"},
            "gateway": {"port": 8443, "extraArgs": ["--workers", "2"]},
        },
    )
    assert chart.fails == [] and chart.kinds() == ["ConfigMap", "Deployment", "Service"]
    _validate(chart)
    spec = chart.one("Deployment")["spec"]
    assert spec["replicas"] == 2
    container = _container(chart)
    assert container["image"].endswith(":0.1.0-3-gabc")
    assert container["args"][-2:] == ["--workers", "2"]
    assert container["ports"][0]["containerPort"] == 8443
    assert container["envFrom"] == [{"secretRef": {"name": "gateway-env"}}]
    redis = next(e for e in container["env"] if e["name"] == "LLMROUTE_REDIS_URL")
    assert redis["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "redis-url"}
    assert all(m["mountPath"] != "/etc/llmroute/keys" for m in container["volumeMounts"])
