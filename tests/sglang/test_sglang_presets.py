"""Launcher presets beyond the TTFT-first defaults: their flags, the check against the installed
SGLang's --help, and the preset a doctor's measurements point to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmroute.sglang import (
    Preset,
    SGLangError,
    SGLangServer,
    TTFTDiagnosis,
    chunked_prefill,
    memory_fraction,
    speculative_decoding,
    suggest_preset,
)
from llmroute.testing import sglang_standin_path


def standin(version: str = "0.5.5") -> dict[str, str]:
    return {"PYTHONPATH": sglang_standin_path(), "SGLANG_STANDIN_VERSION": version}


def test_presets_add_sglangs_documented_flags_after_the_defaults() -> None:
    server = SGLangServer(
        "org/big",
        env=standin(),
        presets=[speculative_decoding("org/draft-0.5b"), chunked_prefill(), memory_fraction(0.8)],
    )
    argv = server.command()
    tail = argv[argv.index("--enable-cache-report") + 1 :]
    assert tail == [
        *("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/draft-0.5b"),
        *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
        *("--speculative-num-draft-tokens", "4", "--chunked-prefill-size", "16384"),
        *("--mem-fraction-static", "0.8"),
    ]
    assert "--schedule-policy" in argv  # the TTFT-first defaults stay


def test_the_users_own_flags_win_over_a_preset() -> None:
    server = SGLangServer(
        "org/big",
        env=standin(),
        presets=[chunked_prefill(16384)],
        extra_args=["--chunked-prefill-size", "4096"],
    )
    argv = server.command()
    assert argv.count("--chunked-prefill-size") == 1
    assert argv[argv.index("--chunked-prefill-size") + 1] == "4096"


@pytest.mark.parametrize(
    ("version", "preset", "missing"),
    [
        ("0.4.0", speculative_decoding("org/d"), "--speculative-algorithm"),
        ("0.3.0", memory_fraction(0.9), None),
        ("0.5.5", speculative_decoding("org/d", algorithm="STANDALONE"), None),
    ],
)
def test_a_preset_the_installed_version_lacks_is_an_error_before_any_spawn(
    version: str, preset: Preset, missing: str | None
) -> None:
    server = SGLangServer("org/big", env=standin(version), presets=[preset])
    if missing is None:
        assert preset.args[0] in server.command()
        return
    with pytest.raises(SGLangError, match=f"needs {missing}.*SGLang {version}"):
        server.command()
    assert server.pids == []


def test_preset_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="one of EAGLE3"):
        speculative_decoding("org/d", algorithm="MEDUSA")
    with pytest.raises(ValueError, match="draft model"):
        speculative_decoding("")
    with pytest.raises(ValueError, match="between 0 and 1"):
        memory_fraction(1.5)
    with pytest.raises(ValueError, match="positive"):
        chunked_prefill(0)


def diagnosis(server: float, queue: float, client: float | None = None) -> TTFTDiagnosis:
    parts = {"transport": 0.0, "queue": queue, "prefill": server - queue}
    return TTFTDiagnosis(client or server, server, queue, "", parts)


@pytest.mark.parametrize(
    ("measured", "itl", "expected"),
    [
        (diagnosis(0.9, 0.6), None, "queueing: 600 ms of the server's 900 ms TTFT is queue"),
        (diagnosis(1.4, 0.1), None, "long prefill: 1300 ms of the server's TTFT"),
        (diagnosis(0.1, 0.01), 0.08, "slow decoding: 80 ms between tokens (12 tokens/s)"),
        (diagnosis(0.1, 0.01), 0.01, None),
    ],
)
def test_the_doctor_suggests_the_preset_its_figures_point_to(
    measured: TTFTDiagnosis, itl: float | None, expected: str | None
) -> None:
    suggestion = suggest_preset(measured, itl)
    if expected is None:
        assert suggestion is None
    else:
        assert suggestion is not None and suggestion.startswith(expected)


def test_the_cli_presets(tmp_path: Path) -> None:
    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "llmroute.cli", "sglang", "launch", "org/big", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **standin()},
            check=False,
        )

    done = launch("--speculative", "standalone", "--draft-model", "org/small", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "--speculative-algorithm STANDALONE" in done.stdout
    assert "--speculative-draft-model-path org/small" in done.stdout
    lonely = launch("--speculative", "eagle3", "--dry-run")
    assert lonely.returncode == 2 and "needs --draft-model" in lonely.stderr
    assert "Traceback" not in lonely.stderr
    old = subprocess.run(
        [
            *(sys.executable, "-m", "llmroute.cli", "sglang", "launch", "org/big"),
            *("--log-dir", str(tmp_path), "--speculative", "eagle3", "--draft-model", "org/d"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **standin("0.4.0")},
        check=False,
    )
    assert old.returncode == 2, old.stderr
    assert "the preset speculative-eagle3 needs --speculative-algorithm" in old.stderr
    assert "Traceback" not in old.stderr  # nothing was started, so nothing to stop
