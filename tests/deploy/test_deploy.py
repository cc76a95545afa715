"""The deployment: the Dockerfile (linted, its last stage's command run as a plain process) and
the Helm chart (rendered by real Helm, every object checked against Kubernetes' schemas and
against the gateway it runs). No Docker engine and no cluster run here: see docs/deploy.md,
"What is tested". The tools: tests/deploy_tools.py."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import tomllib
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest

from llmroute.config import load_config, load_keys_file, resolve
from llmroute.testing import Simulator
from tests.deploy_tools import (
    DOCKERFILE,
    ROOT,
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
    from llmroute.config import parse_duration
    from llmroute.server import _run

    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    command = _container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = int(command[1])
    assert pre_stop == rendered.values["drain"]["preStopSeconds"] > 0
    # After the hook, SIGTERM: the gateway drains for up to --drain, then its own shutdown
    # waits at most _GRACE for connections.
    args = _container(rendered)["args"]
    drain = parse_duration(args[args.index("--drain") + 1])
    assert drain == rendered.values["drain"]["timeoutSeconds"] > 0
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + _run._GRACE + 5


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
            {
                "drain": {
                    "preStopSeconds": 5,
                    "timeoutSeconds": 30,
                    "terminationGracePeriodSeconds": 40,
                }
            },
            "drain.terminationGracePeriodSeconds must be at least drain.preStopSeconds + "
            "drain.timeoutSeconds + 10",
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


# --- the image's command, and the chart's pod, as plain processes --------------------------------

GATEWAY_KEY = "gw-deploy-4b8d1f0e9a"
UPSTREAM_KEY = "sk-sim-deploy-77aa31"


def _sim_config(sim: Simulator) -> str:
    """The chart's default config with the simulator as its one provider."""
    text = chart_values()["config"]
    routes = text.index("[redis]")
    return (
        f'[providers.sim]\nbase_url = "{sim.base_url}"\napi_key_env = "SIM_UPSTREAM_KEY"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n\n'
        + text[routes:].replace("[redis]\n", f'[redis]\nprefix = "deploy-{uuid.uuid4().hex[:8]}"\n')
    )


def _rooted(root: Path, value: str) -> str:
    """An absolute path of the image (/etc/llmroute/..., /home/llmroute) under ``root``."""
    for prefix in ("/etc/llmroute", "/home/llmroute", "/tmp"):
        if value == prefix or value.startswith(prefix + "/"):
            return str(root) + value
    return value


def _mount(root: Path, chart: Rendered) -> tuple[dict[str, str], list[str]]:
    """The pod of ``chart``'s Deployment laid out under ``root``: each volume's files where it is
    mounted (the config's own absolute paths moved under ``root`` too), and the container's
    environment (the image's, then env and envFrom as Kubernetes applies them) and argv
    (the image's entry point, then the container's args)."""
    pod = chart.one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        where = Path(_rooted(root, mount["mountPath"]))
        where.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            files = chart.objects[("ConfigMap", volume["configMap"]["name"])]["data"]
        elif "secret" in volume:
            files = chart.objects[("Secret", volume["secret"]["secretName"])]["stringData"]
        else:
            assert "emptyDir" in volume
            files = {}
        for name, text in files.items():
            path = where / name
            path.write_text(text.replace('"/etc/llmroute/', f'"{root}/etc/llmroute/'))
            path.chmod(0o444)
        if files:
            where.chmod(0o555)
    built = image()
    env = {name: _rooted(root, value) for name, value in built.env.items()}
    env.update({e["name"]: _rooted(root, e["value"]) for e in container["env"] if "value" in e})
    for source in container["envFrom"]:
        env.update(chart.objects[("Secret", source["secretRef"]["name"])]["stringData"])
    return env, built.entrypoint + container["args"]


def _image_run(root: Path, sim: Simulator, redis_url: str) -> tuple[dict[str, str], list[str]]:
    """``docker run -v ...:/etc/llmroute/config -v ...:/etc/llmroute/keys -e ...`` of the image
    as it is: its ENV, ENTRYPOINT and CMD."""
    built = image()
    config = Path(_rooted(root, built.env["LLMROUTE_CONFIG"]))
    config.parent.mkdir(parents=True)
    text = _sim_config(sim).replace('"/etc/llmroute/', f'"{root}/etc/llmroute/')
    config.write_text(text)
    keys = root / "etc/llmroute/keys/keys.toml"
    keys.parent.mkdir(parents=True)
    keys.write_text(chart_values()["keysFile"])
    env = {name: _rooted(root, value) for name, value in built.env.items()}
    env.update(
        LLMROUTE_GATEWAY_KEY=GATEWAY_KEY,
        SIM_UPSTREAM_KEY=UPSTREAM_KEY,
        LLMROUTE_REDIS_URL=redis_url,
    )
    return env, built.entrypoint + built.cmd


def _local(argv: list[str]) -> list[str]:
    """The image's command line on this machine: loopback instead of 0.0.0.0 (tests listen on
    127.0.0.1 only), any free port instead of the fixed one (tests run side by side)."""
    out = list(argv)
    out[out.index("--host") + 1] = "127.0.0.1"
    out[out.index("--port") + 1] = "0"
    return out


@pytest.mark.parametrize("how", ["docker run", "helm pod"])
def test_the_image_command_serves_and_stops_as_a_plain_process(
    tmp_path: Path, sim: Simulator, redis_url: str, how: str
) -> None:
    """The entry point with the image's (or the pod's) environment, config and keys mounted from
    a temporary directory, a HOME of its own and only the image's packages importable: the
    HEALTHCHECK's command and the probes' path answer, a streamed request is routed to the
    simulator through the keys file's key and Redis (read from LLMROUTE_REDIS_URL), and
    SIGTERM ends it with status 0."""
    root = tmp_path / "root"
    if how == "helm pod":
        values = merged(
            VALID,
            {
                "config": _sim_config(sim),
                "redis": {"url": redis_url},
                "secrets": {
                    "env": {"LLMROUTE_GATEWAY_KEY": GATEWAY_KEY, "SIM_UPSTREAM_KEY": UPSTREAM_KEY}
                },
            },
        )
        chart = helm_render(tmp_path, values)
        env, argv = _mount(root, chart)
        probe = _container(chart)["readinessProbe"]["httpGet"]["path"]
    else:
        env, argv = _image_run(root, sim, redis_url)
        probe = "/health"
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    env.update(
        PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",  # llmroute and python, as in the image
        # This checkout's llmroute, and only the packages the image installs.
        PYTHONPATH=f"{_image_site(tmp_path / 'site')}:{ROOT}",
        SSL_CERT_FILE=sim.ca_pem_path,  # the simulator's CA (a real vendor's needs none)
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            _local(argv), stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL, env=env
        )
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 60)  # a hang guard only
        line = proc.stdout.readline().decode() if readable else ""
        assert "llmroute gateway listening on http://127.0.0.1:" in line, log_path.read_text()
        base = line.split("listening on ", 1)[1].split()[0].removesuffix("/v1")
        port = base.rsplit(":", 1)[1]
        health_url = re.sub(r":\d+/", f":{port}/", env["LLMROUTE_HEALTH_URL"])
        assert health_url == base + probe
        check = image().healthcheck
        assert check[0] == "python"
        healthy = subprocess.run(
            [sys.executable, *check[1:]],
            env={**env, "LLMROUTE_HEALTH_URL": health_url},
            capture_output=True,
            timeout=60,
        )
        assert healthy.returncode == 0, healthy.stderr
        with httpx.Client(base_url=base, timeout=60) as http:
            health = http.get(probe)
            assert health.status_code == 200 and health.json()["status"] == "ok"
            body = {
                "model": "chat",
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": True,
            }
            auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
            with http.stream("POST", "/v1/chat/completions", json=body, headers=auth) as answer:
                assert answer.status_code == 200
                assert answer.headers["x-llmroute-target"] == "sim:sim-small"
                events = [e for e in answer.iter_lines() if e.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and len(events) > 3
            refused = http.get("/v1/models", headers={"Authorization": "Bearer gw-not-a-key"})
            assert refused.status_code == 401
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        logged = log_path.read_text()
        assert proc.returncode == 0, logged[-3000:]
        assert b"llmroute gateway stopped" in out
        assert "POST /v1/chat/completions 200 key=default" in logged
        for secret in (GATEWAY_KEY, UPSTREAM_KEY):
            assert secret not in logged + out.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


_IMAGE_SITE = """\
import importlib.abc, sys

ALLOWED = {allowed!r}


class NotInTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_sysconfigdata"):
            return None
        raise ModuleNotFoundError(f"No module named {{name!r}} (not in the image)", name=name)


sys.meta_path.insert(0, NotInTheImage())
"""


def _image_site(where: Path) -> Path:
    """A ``sitecustomize`` that makes every module outside the standard library and the
    distributions ``llmroute[server,redis]`` requires (what the image installs) not found, as
    in the image: an optional import falls back, a needed one fails the gateway."""
    needed = _requirement_closure("llmroute", {"server", "redis"})
    allowed = {"llmroute"} | {
        module
        for module, dists in metadata.packages_distributions().items()
        if {_norm(d) for d in dists} & needed
    }
    where.mkdir()
    (where / "sitecustomize.py").write_text(_IMAGE_SITE.format(allowed=sorted(allowed)))
    return where


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_closure(name: str, extras: set[str]) -> set[str]:
    """``name[extras]`` and every distribution it requires, by the installed metadata."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    queue = [(name, frozenset(extras))]
    while queue:
        dist, wanted = queue.pop()
        key = _norm(dist)
        if key in seen and not wanted:
            continue
        seen.add(key)
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            markers = [{"extra": e} for e in ("", *wanted)]
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                if _norm(req.name) != key:
                    queue.append((req.name, frozenset(req.extras)))
    return seen
