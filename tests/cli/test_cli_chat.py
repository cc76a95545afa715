"""``llmroute chat``, run as a real subprocess against simulators on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

MODEL = "sim-small"


@pytest.fixture(scope="module")
def failing() -> Iterator[Simulator]:
    """Every chat request fails with a 500."""
    with Simulator(profile=Profile(rate_500=1.0), tls=True) as server:
        yield server


def chat(
    *args: str, sim: Simulator, stdin: str | None = None, plain: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LLMROUTE_CONFIG", "OPENAI_BASE_URL")}
    env["SSL_CERT_FILE"] = sim.ca_pem_path
    if plain:
        env.update(OPENAI_API_KEY=KEY, OPENAI_BASE_URL=sim.base_url)
    else:
        env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "llmroute.cli", "chat", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def answer_of(sim: Simulator, prompt: str) -> str:
    """The simulator's deterministic answer to ``prompt``, fetched without streaming."""

    async def fetch() -> str:
        async with AsyncOpenAI(
            api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()
        ) as client:
            done = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}]
            )
            return done.choices[0].message.content or ""

    return anyio.run(fetch)


def routed_config(tmp_path: Path, sim: Simulator, failing: Simulator) -> str:
    path = tmp_path / "llmroute.toml"
    path.write_text(
        f"""
[providers.bad]
base_url = "{failing.base_url}"
api_key = "{KEY}"
[providers.good]
base_url = "{sim.base_url}"
api_key = "{KEY}"
prices."*" = {{ input = 2.5, output = 10 }}

[models.chat]
targets = ["bad:{MODEL}", "good:{MODEL}"]
policy = "failover"

[models.broken]
targets = ["bad:{MODEL}"]
"""
    )
    return str(path)


def test_streams_the_answer_of_the_plain_client(sim: Simulator) -> None:
    prompt = "Why stream tokens?"
    done = chat(prompt, "--model", MODEL, sim=sim)
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer_of(sim, prompt) + "\n"
    assert done.stderr == ""


def test_reads_the_prompt_from_stdin(sim: Simulator) -> None:
    prompt = "A prompt piped in\nover two lines"
    done = chat("-", "--model", MODEL, "--show-route", sim=sim, stdin=prompt)
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer_of(sim, prompt) + "\n"
    assert "route: none" in done.stderr  # a plain model name is not a route
    assert "timings: HTTP/2" in done.stderr


def test_show_route_lists_winner_attempts_and_timings(
    sim: Simulator, failing: Simulator, tmp_path: Path
) -> None:
    config = routed_config(tmp_path, sim, failing)
    done = chat("hello", "--config", config, "--show-route", sim=sim, plain=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer_of(sim, "hello") + "\n"
    lines = done.stderr.splitlines()
    assert lines[0].startswith("route 'chat' (failover): winner good:sim-small")
    assert "cache hit no" in lines[0]
    # what the request cost: the answer's usage at good's price; the failures were not billed
    assert re.fullmatch(r"  cost 0\.\d+ USD", lines[1]), lines[1]
    assert "attempt 1: bad:sim-small" in lines[2] and " error " in lines[2] and "500" in lines[2]
    assert "cost 0 " in lines[2]
    # an ordered route retries its primary once after a 5xx, then fails over
    assert "attempt 2: bad:sim-small" in lines[3] and "retry" in lines[3]
    assert "attempt 3: good:sim-small" in lines[4] and "failover" in lines[4]
    assert " won " in lines[4] and lines[1].replace("  cost", "cost") in lines[4]
    assert lines[5].startswith("timings: HTTP/2, connection ")
    assert "first token" in lines[5] and "tokens" in lines[5]
    assert KEY not in done.stdout + done.stderr


def test_show_route_explains_a_tiered_names_decision(sim: Simulator, tmp_path: Path) -> None:
    pytest.importorskip("wordllama")
    data = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
    path = tmp_path / "llmroute.toml"
    path.write_text(
        f"""
[providers.sim]
base_url = "{sim.base_url}"
api_key = "{KEY}"

[models.chat-small]
targets = ["sim:small-model"]
[models.chat-large]
targets = ["sim:large-model"]

[models.auto]
tiers = {{ simple = "chat-small", hard = "chat-large" }}
default = "chat-large"
examples = "{data}"
"""
    )
    simple = chat("hi there!", "--config", str(path), "--model", "auto", "--show-route", sim=sim)
    assert simple.returncode == 0, simple.stderr
    lines = simple.stderr.splitlines()
    assert re.match(r"route 'chat-small' \(\w+\): winner sim:small-model, TTFT \d+ ms", lines[0])
    assert re.fullmatch(
        r"  tier: 'auto' -> chat-small: class simple, probability (0\.[6-9]\d|1\.00), "
        r"reason classifier, \d+ us",
        lines[1],
    ), lines[1]
    # no price for the model: the cost says so, never 0
    assert lines[2] == "  cost unknown (sim:small-model: no price known for small-model)"
    assert lines[3].startswith("  attempt 1: sim:small-model") and "cost unknown" in lines[3]
    hard = "Prove that every planar graph is 4-colourable, then give an algorithm for it."
    done = chat(hard, "--config", str(path), "--model", "auto", "--show-route", sim=sim)
    assert done.returncode == 0, done.stderr
    assert "winner sim:large-model" in done.stderr.splitlines()[0]
    assert re.search(r"tier: 'auto' -> chat-large: class hard, .* reason classifier", done.stderr)
    assert KEY not in simple.stderr + done.stderr


def test_every_target_failing_exits_1_with_each_cause(
    sim: Simulator, failing: Simulator, tmp_path: Path
) -> None:
    config = routed_config(tmp_path, sim, failing)
    done = chat("hello", "--config", config, "--model", "broken", sim=sim, plain=False)
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("llmroute chat: AllTargetsFailed: Route 'broken'")
    assert "bad:sim-small: InternalServerError" in line
    assert KEY not in done.stderr


def test_config_mistakes_and_empty_prompts_exit_2(sim: Simulator, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[models.chat]\ntargets = ["nowhere:x"]\n')
    done = chat("hello", "--config", str(bad), sim=sim)
    assert done.returncode == 2
    assert done.stderr.startswith("llmroute chat: ") and "nowhere" in done.stderr
    empty = chat("-", sim=sim, stdin="  \n")
    assert empty.returncode == 2 and "empty" in empty.stderr


def test_a_near_miss_of_a_route_exits_2_naming_it(
    sim: Simulator, failing: Simulator, tmp_path: Path
) -> None:
    """docs/cli.md lists name mistakes under exit 2; nothing is sent."""
    config = routed_config(tmp_path, sim, failing)
    done = chat("hello", "--config", config, "--model", "caht", sim=sim, plain=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("llmroute chat: ") and "did you mean 'chat'?" in line


def test_ctrl_c_stops_cleanly() -> None:
    with Simulator(profile=Profile(rate_hang=1.0, hang_max=60), tls=True) as hanging:
        env = {k: v for k, v in os.environ.items() if k != "LLMROUTE_CONFIG"}
        env.update(
            SSL_CERT_FILE=hanging.ca_pem_path,
            OPENAI_API_KEY=KEY,
            OPENAI_BASE_URL=hanging.base_url,
        )
        # A runner started in the background may ignore SIGINT, and its children inherit that:
        # give the CLI Python's default Ctrl-C handling, as a terminal would.
        restore = (
            "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from llmroute.cli import main; sys.exit(main())"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", restore, "chat", "hello", "--model", MODEL],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while hanging.stats()["chat_requests"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert hanging.stats()["chat_requests"] == 1  # waiting for a first token
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "llmroute chat: interrupted"
    assert "Traceback" not in err


def test_a_route_report_prints_as_the_show_route_line() -> None:
    """``print(resp.route)`` was the dataclass's repr (~600 characters); it is the line
    ``--show-route`` prints first, and ``repr()`` keeps every field."""
    from llmroute._types import AttemptReport, RouteReport
    from llmroute.cli._chat import route_lines

    report = RouteReport(
        route="chat",
        policy="hedge",
        winner="fast:sim-small",
        ttft=0.0734,
        attempts=[AttemptReport(target="fast:sim-small", reason="first", started=0.0)],
        hedges=1,
        prompt_class="short",
        trace_id="0" * 32,
    )
    line = str(report)
    assert line == route_lines(report, None, "chat")[0]
    assert line == (
        "route 'chat' (hedge): winner fast:sim-small, TTFT 73 ms, hedges 1 (denied 0), cache hit no"
    )
    assert repr(report).startswith("RouteReport(route='chat'") and "attempts=[" in repr(report)
