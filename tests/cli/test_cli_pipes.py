"""A command whose reader goes away (``llmroute top --once | head -1``) stops at once, silently,
with status 141 as git and the coreutils do; run as real subprocesses writing into a pipe whose
read end is closed before they start, so their first write fails."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from llmroute.cli import CLOSED_PIPE, main


def into_a_closed_pipe(*argv: str) -> tuple[int, str]:
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k not in ("LLMROUTE_CONFIG", "OPENAI_API_KEY")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "llmroute", *argv],
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=90,
            check=False,
            env=env,
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["completion", "bash"],  # plain writes
        ["serve", "--simulator", "--port", "0"],  # its banner, before it serves
        ["top", "--simulator", "--once"],  # inside an anyio task group: an ExceptionGroup
        ["demo", "--requests", "2", "--no-tiers"],  # a rich console
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_closed_stdout_ends_the_command_silently_with_141(argv: list[str]) -> None:
    status, err = into_a_closed_pipe(*argv)
    lines = [line for line in err.splitlines() if " INFO " not in line]  # serve's own log
    assert (status, lines) == (CLOSED_PIPE, []), err


def test_a_broken_socket_is_still_an_error_not_a_closed_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A BrokenPipeError from a connection (stdout still open) is reported like any other."""
    from llmroute.cli import _cache

    async def broken(*args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(_cache, "_cache_command", broken)
    assert main(["cache", "stats"]) == 1
    assert "unexpected error: BrokenPipeError" in capsys.readouterr().err


def test_a_rich_console_hands_a_closed_pipe_to_the_entry() -> None:
    """rich's own handling would exit with status 1 and swap stdout for /dev/null even when the
    console writes to stderr; ours raises, for main() to decide."""
    from llmroute.cli._format import make_console

    read, write = os.pipe()
    os.close(read)
    out = open(write, "w")
    try:
        with pytest.raises(BrokenPipeError):
            make_console(out).print("x" * 100)
    finally:
        with contextlib.suppress(BrokenPipeError):  # what the print left in the buffer
            out.close()
