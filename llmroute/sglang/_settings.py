""":class:`SGLangServer`'s settings, resolved once and frozen, grouped by concern.

The keyword arguments (:class:`SGLangOptions`) map onto four objects:

- :class:`ServerFlags`: what every server is told: ``model_path``, ``served_model_name``,
  ``host``, ``api_key``, ``tp`` (and the data-parallel size), ``extra_args``, ``presets``
  (the TTFT tuning). A value in ``extra_args`` wins over the keyword's.
- :class:`Placement`: where the servers go: ``gpus`` in sets of ``tp`` x ``dp``, the first
  ``port`` (``None``: free ports).
- :class:`ProcessSettings`: how each runs: ``python`` or ``image``, ``env``,
  ``container_args``, ``hf_cache``, ``log_dir``, ``startup_timeout``, ``grace``.
- :class:`GatewaySettings`: SGLang's gateway in front: ``gateway``, ``gateway_port``,
  ``gateway_policy``, ``gateway_args``, ``gateway_command``.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

from ._flags import _parallel_size, _user_value
from ._presets import Preset

__all__ = [
    "GatewaySettings",
    "Placement",
    "ProcessSettings",
    "SGLangOptions",
    "ServerFlags",
    "Settings",
    "SettingsView",
    "resolve",
]


class SGLangOptions(TypedDict, total=False):
    """:class:`SGLangServer`'s keyword arguments (see its docstring)."""

    served_model_name: str | None
    port: int | None
    host: str
    api_key: str | None
    python: str | None
    image: str | None
    gpus: Sequence[int] | None
    tp: int | None
    extra_args: Sequence[str]
    log_dir: str | os.PathLike[str] | None
    startup_timeout: float
    grace: float
    env: Mapping[str, str] | None
    container_args: Sequence[str]
    hf_cache: str | os.PathLike[str] | Literal[False] | None
    gateway: bool
    gateway_port: int | None
    gateway_policy: str
    gateway_args: Sequence[str]
    gateway_command: Sequence[str] | None
    presets: Sequence[Preset]


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """What every server is told; ``pass_tp``: ``--tp-size`` is the launcher's to pass."""

    model_path: str
    served_model_name: str
    host: str
    api_key: str = field(repr=False)
    tp: int
    dp: int
    pass_tp: bool
    extra_args: tuple[str, ...]
    presets: tuple[Preset, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """One GPU set per server (``()``: whatever the environment shows) and the first port."""

    gpu_sets: tuple[tuple[int, ...], ...]
    port: int | None


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """How each server runs: from ``python`` or in ``image``, its environment, logs, waits."""

    python: str
    image: str | None
    env: dict[str, str]
    container_args: tuple[str, ...]
    hf_cache: str | os.PathLike[str] | Literal[False] | None
    log_dir: Path | None
    startup_timeout: float
    grace: float


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """SGLang's gateway (``smg``) in front of the servers, when ``enabled``."""

    enabled: bool = False
    port: int | None = None
    policy: str = "cache_aware"
    args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None


class SettingsView:
    """The resolved settings as :class:`SGLangServer`'s read-only attributes."""

    _server_flags: ServerFlags
    _process: ProcessSettings

    @property
    def model_path(self) -> str:
        return self._server_flags.model_path

    @property
    def served_model_name(self) -> str:
        return self._server_flags.served_model_name

    @property
    def host(self) -> str:
        return self._server_flags.host

    @property
    def tp(self) -> int:
        return self._server_flags.tp

    @property
    def dp(self) -> int:
        return self._server_flags.dp

    @property
    def extra_args(self) -> tuple[str, ...]:
        return self._server_flags.extra_args

    @property
    def presets(self) -> tuple[Preset, ...]:
        return self._server_flags.presets

    @property
    def python(self) -> str:
        return self._process.python

    @property
    def image(self) -> str | None:
        return self._process.image

    @property
    def env(self) -> dict[str, str]:
        return self._process.env

    @property
    def container_args(self) -> tuple[str, ...]:
        return self._process.container_args

    @property
    def startup_timeout(self) -> float:
        return self._process.startup_timeout

    @property
    def grace(self) -> float:
        return self._process.grace


@dataclass(frozen=True, slots=True)
class Settings:
    flags: ServerFlags
    placement: Placement
    process: ProcessSettings
    gateway: GatewaySettings


def resolve(model_path: str, options: SGLangOptions) -> Settings:
    """The settings ``options`` ask for; raises ``TypeError`` or ``ValueError`` naming the
    argument at fault."""
    unknown = sorted(set(options) - set(SGLangOptions.__annotations__))
    if unknown:
        raise TypeError(f"SGLangServer() got an unexpected keyword argument {unknown[0]!r}")
    extra_args = options.get("extra_args", ())
    if isinstance(extra_args, str):
        raise TypeError("extra_args must be a sequence of arguments, not one string")
    extra = tuple(str(arg) for arg in extra_args)
    process = _process(options)
    tp, dp, pass_tp = _parallel(options.get("tp"), extra)
    placement = _placement(options.get("gpus"), options.get("port"), (tp, dp), extra)
    flags = _flags(model_path, options, extra, (tp, dp, pass_tp))
    gateway = GatewaySettings(
        enabled=bool(options.get("gateway", False)),
        port=options.get("gateway_port"),
        policy=options.get("gateway_policy", "cache_aware"),
        args=tuple(options.get("gateway_args", ())),
        command=_optional_tuple(options.get("gateway_command")),
    )
    return Settings(flags, placement, process, gateway)


def _optional_tuple(values: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(values) if values is not None else None


def _process(options: SGLangOptions) -> ProcessSettings:
    startup_timeout = options.get("startup_timeout", 600.0)
    grace = options.get("grace", 30.0)
    if not (startup_timeout > 0 and math.isfinite(startup_timeout)):
        raise ValueError(f"startup_timeout must be a positive number, got {startup_timeout!r}")
    if not (grace >= 0 and math.isfinite(grace)):
        raise ValueError(f"grace must be a non-negative number, got {grace!r}")
    log_dir = options.get("log_dir")
    return ProcessSettings(
        python=options.get("python", sys.executable) or sys.executable,
        image=options.get("image"),
        env=dict(options.get("env") or {}),
        container_args=tuple(options.get("container_args", ())),
        hf_cache=options.get("hf_cache"),
        log_dir=Path(log_dir) if log_dir is not None else None,
        startup_timeout=float(startup_timeout),
        grace=float(grace),
    )


def _parallel(tp: int | None, extra: Sequence[str]) -> tuple[int, int, bool]:
    """Tensor- and data-parallel sizes, and whether ``--tp-size`` is the launcher's to pass."""
    user_tp = _parallel_size(extra, "--tp-size")
    if tp is not None and user_tp is not None and int(tp) != user_tp:
        raise ValueError(f"tp={tp} and the SGLang flag --tp-size {user_tp} disagree")
    size = int(tp) if tp is not None else (user_tp or 1)
    dp = _parallel_size(extra, "--dp-size") or 1
    if size < 1 or dp < 1:
        raise ValueError("the tensor- and data-parallel sizes must be at least 1")
    return size, dp, tp is not None and user_tp is None and size > 1


def _placement(
    gpus: Sequence[int] | None, port: int | None, sizes: tuple[int, int], extra: Sequence[str]
) -> Placement:
    tp, dp = sizes
    per = tp * dp
    gpu_sets: list[tuple[int, ...]] = [()]
    if gpus is not None:
        gpu_list = [int(gpu) for gpu in gpus]
        if not gpu_list:
            raise ValueError("gpus must name at least one GPU (or be None)")
        if len(set(gpu_list)) != len(gpu_list):
            raise ValueError(f"gpus has duplicates: {list(gpus)}")
        if len(gpu_list) % per:
            raise ValueError(
                f"{len(gpu_list)} GPU(s) {gpu_list} do not divide into servers of "
                f"{per} GPU(s) each (tensor parallel {tp} x data parallel {dp}): "
                f"give a multiple of {per} GPUs"
            )
        gpu_sets = [tuple(gpu_list[i : i + per]) for i in range(0, len(gpu_list), per)]
    user_port = _user_value(extra, "--port")
    if user_port is not None:
        if len(gpu_sets) > 1:
            raise ValueError("with several servers give the first port as port=, not --port")
        port = int(user_port)
    return Placement(tuple(gpu_sets), port)


def _flags(
    model_path: str, options: SGLangOptions, extra: tuple[str, ...], sizes: tuple[int, int, bool]
) -> ServerFlags:
    path = _user_value(extra, "--model-path") or model_path
    return ServerFlags(
        model_path=path,
        served_model_name=(
            _user_value(extra, "--served-model-name")
            or options.get("served_model_name")
            or path.rstrip("/").rsplit("/", 1)[-1]
        ),
        host=_user_value(extra, "--host") or options.get("host", "127.0.0.1"),
        api_key=(
            _user_value(extra, "--api-key")
            or options.get("api_key")
            or "sk-" + secrets.token_urlsafe(32)
        ),
        tp=sizes[0],
        dp=sizes[1],
        pass_tp=sizes[2],
        extra_args=extra,
        presets=tuple(options.get("presets", ())),
    )
