"""What SGLang a launcher will run: its version and the flags its entry point lists.

The probe is one generator, :func:`detection`, that yields each child process it needs
(``import sglang``, then the entry point's ``--help`` unless cached) and reads their results; it
does no I/O itself. Two thin shells run it: :func:`detect` (blocking, for
:meth:`SGLangServer.command`) and :func:`detect_async` (for :meth:`SGLangServer.start`: its
children are killed when the start is cancelled).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import anyio

from ._command import DEFAULT_FLAGS, _gpu_names, entry_point
from ._presets import Preset
from ._process import _LOG_TAIL_LINES, SGLangError

__all__ = [
    "HELP_TIMEOUT",
    "Probe",
    "SGLangConfigError",
    "SGLangNotInstalled",
    "accept",
    "check_gpus",
    "detect",
    "detect_async",
    "detection",
    "install_commands",
    "install_hint",
]

log = logging.getLogger("llmroute.sglang")

HELP_TIMEOUT: Final = 120.0
"""Seconds allowed for the entry point's ``--help`` (it imports the server's argument module)."""

_VERSION_CODE: Final = "import sglang; print(sglang.__version__)"
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_CHOICES = re.compile(r"\{([\w.,-]+)\}")

# Help texts by (interpreter, version, PYTHONPATH): the flags each entry point lists, or None
# when the help could not be read (then no default flag is dropped).
_help_cache: dict[tuple[str, str, str, str], frozenset[str] | None] = {}
_help_lock = threading.Lock()


class SGLangNotInstalled(SGLangError):
    """Raised when the chosen Python interpreter cannot import sglang."""


class SGLangConfigError(SGLangError):
    """Raised before any server starts when what was asked for cannot work here: a preset the
    installed SGLang lacks, a GPU this host does not have."""


def install_commands(python: str) -> list[str]:
    """The commands that install SGLang for the interpreter ``python``: the one text both the
    launcher's error and docs/sglang.md's recipe give (a test holds them together)."""
    return [
        f"{python} -m pip install --upgrade pip uv",
        f"{python} -m uv pip install --python {python} sglang",
    ]


def install_hint(python: str) -> str:
    """How to get SGLang for ``python``, or do without it, as one sentence."""
    return (
        "SGLang's server needs a Linux host with an NVIDIA GPU (CUDA). Install it into that "
        f"interpreter ({' && '.join(install_commands(python))}; SGLang's install guide has the "
        "variants for CUDA 13 hosts), or name an interpreter that has it (python=, --python), "
        "or run SGLang's container image instead (image=, --image lmsysorg/sglang:latest). "
        "See docs/sglang.md"
    )


@dataclass(frozen=True, slots=True)
class _Run:
    """A child process the probe needs run: argv, environment, seconds allowed."""

    argv: list[str]
    env: dict[str, str]
    timeout: float


@dataclass(frozen=True, slots=True)
class _Ran:
    returncode: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True, slots=True)
class Probe:
    """Where SGLang runs: the interpreter ``python``, or the container image ``image`` (then
    ``python3`` inside it); ``env`` is the probes' environment."""

    python: str
    image: str | None
    env: Mapping[str, str]
    version_timeout: float

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the server runs: here, or in a throwaway container of the image
        (``docker run --rm --entrypoint <argv[0]> <image> <argv[1:]>``, no GPU needed)."""
        if self.image is None:
            return list(argv)
        return ["docker", "run", "--rm", "--entrypoint", argv[0], self.image, *argv[1:]]

    def where(self) -> str:
        if self.image is not None:
            return f"the container image {self.image}"
        return f"the Python interpreter {self.python}"

    def no_interpreter(self) -> SGLangError:
        if self.image is not None:
            return SGLangError(
                "docker is not on this host's PATH: a container image (image=, --image) needs "
                "Docker with the NVIDIA Container Toolkit; or run SGLang from a Python "
                "interpreter that has it (python=, --python)"
            )
        return SGLangNotInstalled(
            f"the Python interpreter {self.python!r} does not exist. " + install_hint("python")
        )

    def cannot_run(self, exc: OSError) -> SGLangError:
        what = "docker" if self.image is not None else f"the Python interpreter {self.python!r}"
        return SGLangError(f"cannot run {what}: {exc}")

    def import_too_slow(self) -> SGLangError:
        return SGLangError(
            f"importing sglang in {self.where()} took over {self.version_timeout:.0f} s"
        )

    def read_version(self, ran: _Ran) -> str:
        """The version the probe printed; raises when it could not import sglang."""
        errors = ran.stderr.decode("utf-8", "replace")
        if ran.returncode != 0:
            if "No module named 'sglang'" in errors or "No module named sglang" in errors:
                if self.image is not None:
                    raise SGLangNotInstalled(
                        f"SGLang is not installed in the container image {self.image} (import "
                        "sglang fails): choose an SGLang image, such as lmsysorg/sglang:latest"
                    )
                raise SGLangNotInstalled(
                    f"SGLang is not installed for the Python interpreter {self.python} "
                    "(import sglang fails). " + install_hint(self.python)
                )
            tail = "\n".join("  " + line for line in errors.splitlines()[-_LOG_TAIL_LINES:])
            raise SGLangError(
                f"could not import sglang in {self.where()} (status {ran.returncode}):\n{tail}"
            )
        lines = ran.stdout.decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""

    def help_key(self, version: str) -> tuple[str, str, str, str]:
        """Help texts are cached by interpreter (or image), version, PYTHONPATH and entry
        point."""
        where = self.image if self.image is not None else self.python
        point = entry_point(self.python, self.image, version)[1]
        return (where, version, self.env.get("PYTHONPATH", ""), point)


def _read_help(ran: _Ran) -> frozenset[str] | None:
    text = (ran.stdout + b"\n" + ran.stderr).decode("utf-8", "replace")
    flags = frozenset(_FLAG.findall(text)) or None
    if flags is not None:  # and the choices argparse lists, {EAGLE,EAGLE3,...}
        choices = (c.strip() for group in _CHOICES.findall(text) for c in group.split(","))
        flags |= {choice for choice in choices if choice}
    if flags is None:
        log.warning("SGLang's --help listed no flags; passing every default flag")
    return flags


def _help_failed(why: str) -> None:
    log.warning("could not read the SGLang server's --help (%s); passing every flag", why)


Detection = Generator[_Run, _Ran, "tuple[str, frozenset[str] | None]"]
"""Detection's steps: each yields a process to run, is sent its result, returns the answer."""


def detection(probe: Probe) -> Detection:
    """The version and the listed flags (``None``: unknown), yielding each process to run and
    receiving its result; a failed run is thrown in (``TimeoutError`` when too slow)."""
    python = "python3" if probe.image is not None else probe.python
    try:
        argv = probe.argv([python, "-c", _VERSION_CODE])
        done = yield _Run(argv, dict(probe.env), probe.version_timeout)
    except FileNotFoundError as exc:
        raise probe.no_interpreter() from exc
    except TimeoutError as exc:  # an OSError: before it
        raise probe.import_too_slow() from exc
    except OSError as exc:
        raise probe.cannot_run(exc) from exc
    version = probe.read_version(done)
    key = probe.help_key(version)
    with _help_lock:
        cached = key in _help_cache
        flags = _help_cache.get(key)
    if not cached:
        argv = probe.argv([*entry_point(probe.python, probe.image, version), "--help"])
        try:
            flags = _read_help((yield _Run(argv, dict(probe.env), HELP_TIMEOUT)))
        except TimeoutError:
            flags = _help_failed(f"it took over {HELP_TIMEOUT:.0f} s")
        except OSError as exc:
            flags = _help_failed(str(exc))
        with _help_lock:
            _help_cache[key] = flags
    return version, flags


def _run(run: _Run) -> _Ran:
    try:
        done = subprocess.run(
            run.argv,
            env=run.env,
            capture_output=True,
            timeout=run.timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{run.argv[0]} took over {run.timeout:.0f} s") from exc
    return _Ran(done.returncode, done.stdout, done.stderr)


async def _run_async(run: _Run) -> _Ran:
    with anyio.fail_after(run.timeout):
        done = await anyio.run_process(run.argv, env=run.env, stdin=subprocess.DEVNULL, check=False)
    return _Ran(done.returncode, done.stdout, done.stderr)


Detected = tuple[str, frozenset[str] | None]


def _feed(steps: Detection, outcome: _Ran | OSError | None) -> _Run | Detected:
    """The next process ``steps`` need after ``outcome`` (``None``: the first), or its answer."""
    try:
        if outcome is None:
            return next(steps)
        if isinstance(outcome, OSError):
            return steps.throw(outcome)
        return steps.send(outcome)
    except StopIteration as stop:
        return stop.value


def detect(probe: Probe) -> Detected:
    """:func:`detection` run with blocking child processes."""
    steps = detection(probe)
    step = _feed(steps, None)
    while isinstance(step, _Run):
        try:
            outcome: _Ran | OSError = _run(step)
        except OSError as exc:  # TimeoutError too
            outcome = exc
        step = _feed(steps, outcome)
    return step


async def detect_async(probe: Probe) -> Detected:
    """:func:`detection` run with child processes that cancellation kills (a cancelled start
    does not wait for a slow ``import sglang`` or ``--help``)."""
    steps = detection(probe)
    step = _feed(steps, None)
    while isinstance(step, _Run):
        try:
            outcome: _Ran | OSError = await _run_async(step)
        except OSError as exc:  # TimeoutError too
            outcome = exc
        step = _feed(steps, outcome)
    return step


def accept(
    flags: frozenset[str] | None, version: str, presets: Sequence[Preset], where: str
) -> None:
    """Raise when a preset needs a flag the version lacks; log the default flags it lacks."""
    for preset in presets:
        missing = preset.missing(flags)
        if missing:
            raise SGLangConfigError(
                f"the preset {preset.name} needs {', '.join(missing)}, which SGLang "
                f"{version or '(this version)'} in {where} does not have: "
                "upgrade SGLang or leave the preset out"
            )
    if flags is not None:
        unknown = [flag for flag in DEFAULT_FLAGS if flag not in flags]
        if unknown:
            log.info("SGLang %s does not know %s: not passed", version, ", ".join(unknown))


async def check_gpus(wanted: Sequence[int], env: Mapping[str, str]) -> None:
    """Raise when a GPU ``wanted`` is not on this host, as ``nvidia-smi -L`` lists them (no
    check without ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if not wanted or smi is None:
        return
    try:
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [smi, "-L"], env=env, stdin=subprocess.DEVNULL, check=False
            )
    except (OSError, TimeoutError):
        return
    if done.returncode != 0:
        return
    listed = done.stdout.decode("utf-8", "replace").splitlines()
    count = sum(1 for line in listed if line.startswith("GPU "))
    missing = [gpu for gpu in wanted if gpu >= count]
    if missing:
        have = f"GPUs 0-{count - 1}" if count > 1 else "GPU 0" if count else "no GPU"
        raise SGLangConfigError(
            f"{_gpu_names(missing)} not on this host: nvidia-smi lists {have}; "
            "choose GPUs from those (--gpus / gpus=)"
        )
