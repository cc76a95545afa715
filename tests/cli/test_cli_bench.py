"""``llmroute bench`` against simulators on loopback: counts, JSON, the PNG, errors, no keys."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmroute.cli import main
from llmroute.cli._bench import LENGTHS, prompt_for
from llmroute.testing import Simulator

from ..conftest import KEY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def check_consistent(data: dict[str, Any], probes: int, lengths: list[str]) -> None:
    """Rows and samples agree: every (target, length) has ``probes`` samples, counted right."""
    samples = data["samples"]
    assert len(data["summary"]) == len(data["targets"]) * len(lengths)
    assert len(samples) == len(data["targets"]) * len(lengths) * probes
    for row in data["summary"]:
        group = [
            s for s in samples if s["target"] == row["target"] and s["length"] == row["length"]
        ]
        assert row["probes"] == len(group) == probes
        assert row["ok"] + row["errors"] == probes
        assert row["errors"] == sum(s["error"] is not None for s in group)
        if row["ok"]:
            assert row["ttft_p50"] <= row["ttft_p95"] <= row["ttft_p99"]
            ttfts = [s["ttft"] for s in group if s["error"] is None]
            assert min(ttfts) <= row["ttft_p50"] <= max(ttfts)
        else:
            assert row["ttft_p50"] is None
    for sample in samples:
        if sample["error"] is None:
            assert sample["ttft"] is not None and sample["total"] >= sample["ttft"]
        assert sample["prompt_chars"] > 0


def test_simulator_bench_counts_every_probe_and_writes_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "ttft.png"
    status = main(
        [
            "bench",
            "--simulator",
            "--probes",
            "4",
            "--lengths",
            "short,long",
            "--concurrency",
            "6",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    shown = capsys.readouterr().out
    assert status == 0
    data = load(out)
    assert data["targets"] == [
        "fast-but-spiky:sim-small",
        "steady-slow:sim-small",
        "flaky:sim-small",
    ]
    assert data["settings"]["lengths"] == {"short": 50, "long": 4000}
    assert data["settings"]["nonce"] is True
    check_consistent(data, 4, ["short", "long"])
    for target in data["targets"]:
        assert target in shown
    assert "short (~50 tok)" in shown and "long (~4000 tok)" in shown
    assert "medium" not in shown
    head = png.read_bytes()
    assert head.startswith(PNG_MAGIC) and len(head) > 10_000


def test_failed_probes_are_counted_and_no_key_is_written(
    sim: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.good]
base_url = "{sim.base_url}"
api_key = "{KEY}"
[providers.dead]
base_url = "https://127.0.0.1:{dead_port}/v1"
api_key = "{KEY}"
[models.chat]
targets = ["good:sim-small", "dead:sim-small"]
"""
    )
    monkeypatch.setenv("SSL_CERT_FILE", sim.ca_pem_path)
    out = tmp_path / "bench.json"
    status = main(
        [
            *("bench", "--config", str(config), "--probes", "3", "--lengths", "short,medium"),
            *("--json", str(out), "--timeout", "10"),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0
    text = out.read_text()
    assert KEY not in text and KEY not in captured.out + captured.err
    data = load(out)
    check_consistent(data, 3, ["short", "medium"])
    rows = {(r["target"], r["length"]): r for r in data["summary"]}
    for length in ("short", "medium"):
        assert rows["good:sim-small", length]["errors"] == 0
        assert rows["dead:sim-small", length]["ok"] == 0
        assert rows["dead:sim-small", length]["errors"] == 3
    assert all(
        s["error"].startswith("APIConnectionError")
        for s in data["samples"]
        if s["target"] == "dead:sim-small"
    )
    assert "6 of 12 probes failed" in captured.out


def test_targets_option_limits_the_probes(
    sim: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    status = main(
        [
            *("bench", "--simulator", "--targets", "steady-slow:sim-small", "--probes", "2"),
            *("--lengths", "short", "--json", str(out)),
        ]
    )
    assert status == 0
    data = load(out)
    assert data["targets"] == ["steady-slow:sim-small"]
    check_consistent(data, 2, ["short"])
    assert main(["bench", "--simulator", "--targets", "nope:x,flaky:sim-small"]) == 2
    err = capsys.readouterr().err
    assert "unknown target nope:x" in err
    # Every target there is, not only the ones selected.
    assert "fast-but-spiky:sim-small, steady-slow:sim-small, flaky:sim-small" in err


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    png = tmp_path / "ttft.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # makes `import matplotlib` fail
        "from llmroute.cli import main\n"
        f"raise SystemExit(main(['bench', '--simulator', '--plot', {str(png)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    # From this checkout, the command that works here: llmroute is not on PyPI yet.
    root = Path(__file__).resolve().parents[2]
    assert f"matplotlib is not installed: pip install -e '{root}[plot]'" in done.stderr
    assert done.stdout == ""  # it says so before any probe
    assert not png.exists()


def test_bad_options_and_missing_config_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    assert main(["bench", "--simulator", "--lengths", "short,huge"]) == 2
    assert "unknown length class huge" in capsys.readouterr().err
    monkeypatch.delenv("LLMROUTE_CONFIG", raising=False)
    assert main(["bench"]) == 2
    assert "no config" in capsys.readouterr().err


def test_prompt_set_is_fixed_sized_and_nonced() -> None:
    assert prompt_for("medium", 3, None) == prompt_for("medium", 3, None)
    assert prompt_for("short", 0, None) != prompt_for("short", 1, None)
    for length, tokens in LENGTHS.items():
        chars = len(prompt_for(length, 0, None)[0]["content"])
        assert tokens * 3 < chars < tokens * 5
    nonced = prompt_for("long", 0, "abc123")[0]["content"]
    assert nonced.startswith("[probe abc123] ")
    assert nonced.endswith(prompt_for("long", 0, None)[0]["content"])


HEADER_KEY = "hdr-secret-0123456789-azure"
HEADER_TOKEN = "tok-secret-9876543210-bearer"


class _RaisingCompletions:
    async def create(self, **_: Any) -> Any:
        raise RuntimeError(
            f"proxy refused api-key {HEADER_KEY} and Authorization: Bearer {HEADER_TOKEN} "
            f"(key {KEY})"
        )


class _RaisingClient:
    """An AsyncOpenAI whose every request fails with an exception that is no OpenAIError."""

    def __init__(self, **_: Any) -> None:
        self.chat = type("Chat", (), {"completions": _RaisingCompletions()})()

    async def __aenter__(self) -> _RaisingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def warmup(self) -> None:
        return None


def test_any_probe_failure_is_counted_and_no_header_secret_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """A probe failing with any exception (not only an OpenAIError) is that probe's error, not
    the end of the run; the provider's secret header values are scrubbed like its key."""
    import llmroute

    config = tmp_path / "llmroute.toml"
    config.write_text(
        f"""
[providers.azure]
base_url = "https://127.0.0.1:9/v1"
api_key = "{KEY}"
headers = {{ "api-key" = "{HEADER_KEY}", "Authorization" = "Bearer {HEADER_TOKEN}" }}
[models.chat]
targets = ["azure:gpt"]
"""
    )
    monkeypatch.setattr(llmroute, "AsyncOpenAI", _RaisingClient)
    out = tmp_path / "bench.json"
    status = main(
        [
            "bench",
            "--config",
            str(config),
            "--probes",
            "2",
            "--lengths",
            "short",
            "--json",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0
    shown = out.read_text() + captured.out + captured.err
    for secret in (KEY, HEADER_KEY, HEADER_TOKEN):
        assert secret not in shown
    data = load(out)
    check_consistent(data, 2, ["short"])
    errors = [s["error"] for s in data["samples"]]
    assert len(errors) == 2
    assert all(e.startswith("RuntimeError: proxy refused api-key <key>") for e in errors)
    assert "2 of 2 probes failed" in captured.out


def test_cancelling_a_probe_is_not_counted_as_its_error() -> None:
    import anyio

    from llmroute.cli._bench import Probe, _Endpoint, _probe  # pyright: ignore[reportPrivateUsage]

    class Hanging:
        async def create(self, **_: Any) -> Any:
            await anyio.sleep_forever()

    client: Any = type("Client", (), {"chat": type("Chat", (), {"completions": Hanging()})()})()
    sample = Probe("t:m", "short", 0, 10, started=0.0)
    args = type("Args", (), {"timeout": 30.0, "max_tokens": 4})()

    async def main_() -> bool:
        with anyio.move_on_after(0.05) as scope:
            await _probe(client, _Endpoint("t:m", "m", {}), sample, [], args)
        return scope.cancelled_caught

    assert anyio.run(main_) is True
    assert sample.error is None
