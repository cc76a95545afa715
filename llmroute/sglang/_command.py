"""The command line that starts one SGLang server: its entry point, flags and container wrap.

Pure functions of the launcher's settings (:mod:`._settings`), a worker's GPUs and port, and
the flags the installed SGLang lists (``None``: unknown, then every default flag is passed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ._flags import _flag_name
from ._presets import preset_args
from ._process import _url_host

if TYPE_CHECKING:
    from ._settings import ProcessSettings, ServerFlags

__all__ = ["DEFAULT_FLAGS", "SGLANG_SERVE_SINCE", "parse_release"]

SGLANG_SERVE_SINCE: Final = (0, 5, 5)
"""The first SGLang release with the ``sglang serve`` command: 0.5.5 (November 2025) ships
``sglang/cli/main.py`` and the console script ``sglang = sglang.cli.main:main``; 0.5.4.post3, the
release before it, has no ``sglang.cli`` package (both wheels on PyPI; sgl-project/sglang#12484)."""

_SERVE_CODE: Final = (
    "import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; sys.exit(main())"
)

DEFAULT_FLAGS: Final = (
    "--model-path",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--schedule-policy",
    "--enable-metrics",
    "--enable-cache-report",
)
"""The flags the launcher sets itself, each explained in :meth:`SGLangServer.default_args`."""

_CONTAINER_HF_CACHE: Final = "/root/.cache/huggingface"
"""The Hugging Face cache inside SGLang's images (they run as root)."""
_HF_TOKENS: Final = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
"""Passed into a container by name when set (``-e NAME``): gated models need them."""


def parse_release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string: ``"0.5.4.post3"`` -> ``(0, 5, 4)``.

    Pre-releases count as their release (``"0.5.5rc0"`` -> ``(0, 5, 5)``); an unreadable
    version is ``()``, older than any.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _gpu_names(gpus: Sequence[int]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def _tokens(flag: str, value: str | None) -> list[str]:
    if value is None:
        return [flag]
    # argparse takes "--flag -x" for a missing value; "--flag=-x" is unambiguous.
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def entry_point(python: str, image: str | None, version: str) -> list[str]:
    """``sglang serve`` from :data:`SGLANG_SERVE_SINCE` on, else ``-m sglang.launch_server``
    (``python3`` inside a container image)."""
    python = "python3" if image is not None else python
    if parse_release(version) >= SGLANG_SERVE_SINCE:
        return [python, "-c", _SERVE_CODE, "serve"]
    return [python, "-m", "sglang.launch_server"]


def default_pairs(flags: ServerFlags, image: str | None, port: int) -> list[tuple[str, str | None]]:
    """The launcher's own flags and values for the worker on ``port``."""
    listen = "0.0.0.0" if image is not None else flags.host
    return [
        ("--model-path", flags.model_path),
        ("--served-model-name", flags.served_model_name),
        ("--host", listen),
        ("--port", str(port)),
        ("--api-key", flags.api_key),
        ("--schedule-policy", "lpm"),
        ("--enable-metrics", None),
        ("--enable-cache-report", None),
        *([("--tp-size", str(flags.tp))] if flags.pass_tp else []),
    ]


def server_args(
    flags: ServerFlags, pairs: Sequence[tuple[str, str | None]], known: frozenset[str] | None
) -> list[str]:
    """The server's arguments: the default ``pairs`` the version knows and the user did not
    give, then the presets', then the user's."""
    user = {name for token in flags.extra_args if (name := _flag_name(token)) is not None}
    chosen: list[str] = []
    for flag, value in pairs:
        listed = known is None or flag in known or flag == "--model-path"
        if flag not in user and listed:
            chosen += _tokens(flag, value)
    return [*chosen, *preset_args(flags.presets, user), *flags.extra_args]


def hf_cache_dir(process: ProcessSettings, env: Mapping[str, str]) -> Path | None:
    """The host directory mounted as a container's Hugging Face cache (see
    :meth:`SGLangServer.hf_cache_dir`)."""
    if process.image is None or process.hf_cache is False:
        return None
    if any(_CONTAINER_HF_CACHE in arg for arg in process.container_args):
        return None
    if process.hf_cache is not None and process.hf_cache is not True:
        return Path(process.hf_cache).expanduser()
    home = env.get("HF_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface"


def in_container(
    process: ProcessSettings,
    host: str,
    gpus: Sequence[int],
    port: int,
    container: str | None,
    args: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """``args`` wrapped in ``docker run`` of the image, on ``gpus``, publishing ``port``."""
    assert process.image is not None
    # docker reads --gpus as CSV: several devices must be quoted ('"device=0,1"').
    devices = ",".join(map(str, gpus))
    device = "all" if not gpus else f"device={devices}" if len(gpus) == 1 else f'"device={devices}"'
    docker = ["docker", "run", "--gpus", device]
    docker += ["--rm", "--init", "-p", f"{_url_host(host)}:{port}:{port}"]
    docker += ["--ipc=host"]
    if container is not None:
        docker += ["--name", container]
    hf_cache = hf_cache_dir(process, env)
    if hf_cache is not None:
        docker += ["-v", f"{hf_cache}:{_CONTAINER_HF_CACHE}"]
    # Values come from docker's environment, never the command line.
    passed = {**process.env, **dict.fromkeys(n for n in _HF_TOKENS if env.get(n))}
    for name in passed:
        docker += ["-e", name]
    return [*docker, *process.container_args, process.image, *args]
