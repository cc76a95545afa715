"""The README's quickstart and `make demo` run as written (real subprocesses)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_runs_as_written() -> None:
    out = run("examples/quickstart.py")
    assert "TTFT" in out and "HTTP/2" in out


def test_make_demo_runs_the_demo_command() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/llmroute demo" in recipe
    out = run("-m", "llmroute.cli", "demo", "--requests", "24", "--concurrency", "12")
    assert "Summary:" in out and "P95 improvement:" in out
    assert re.search(r"routed: hedge \+ cache +\d+ +\d+ +\d+ ms", out)


def test_make_demo_installs_what_a_user_needs_with_a_line_per_step(tmp_path: Path) -> None:
    """``make demo`` installed the developer's tools (.[dev,tiers], about 760 MB) quietly, over
    a minute without a line; it installs .[all] into .venv under its own stamp, saying each
    step and showing pip's lines, and ``make test`` still gets .[dev,tiers]. Run with a stand-in
    .venv/bin/python and llmroute that record their arguments."""
    import os
    import shutil
    import time

    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    for tool in ("python", "llmroute"):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        script.chmod(0o755)

    def make(*targets: str) -> str:
        done = subprocess.run(
            ["make", "--no-print-directory", *targets],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = make("demo")
    assert calls.read_text().splitlines() == [
        "python -m pip install --disable-pip-version-check -e .[all]",
        "llmroute demo",
    ]
    for step in ("1/3", "2/3", "3/3"):
        assert f"make demo: {step}" in out
    assert (tmp_path / ".venv" / ".installed-all").exists()
    calls.unlink()
    make("demo")  # installed: the demo only
    assert calls.read_text().splitlines() == ["llmroute demo"]
    # A developer's current environment (.[dev,tiers] holds .[all]) serves the demo as it is.
    (tmp_path / ".venv" / ".installed-all").unlink()
    (tmp_path / ".venv" / ".installed").touch()
    later = time.time() + 5
    os.utime(tmp_path / ".venv" / ".installed", (later, later))
    calls.unlink()
    assert "has the developer's extras" in make("demo")
    assert calls.read_text().splitlines() == ["llmroute demo"]
    dry = make("-n", "-B", "test-main")
    assert "pip install --quiet -e '.[dev,tiers]'" in dry


def test_routing_example_hedges_and_reports() -> None:
    out = run("examples/routing.py")
    assert len(re.findall(r"first token +\d+ ms", out)) == 12
    assert "fast:sim-small" in out and "live stats" in out


def _readme_block(start: str) -> str:
    """The README's fenced block whose text begins with ``start``."""
    readme = (ROOT / "README.md").read_text()
    for block in re.findall(r"```[a-z]*\n(.*?)```", readme, flags=re.DOTALL):
        if block.startswith(start):
            return str(block)
    raise AssertionError(f"no README block starts with {start!r}")


def test_readme_one_key_routing_runs_as_written(tmp_path: Path) -> None:
    """The README's one-vendor config needs OPENAI_API_KEY only, and examples/one_key.py (the
    README's code, verbatim) routes over it; offline, the openai provider's base_url points at a
    simulator and the simulator's CA is trusted through SSL_CERT_FILE."""
    import os

    from llmroute.config import load_config, resolve
    from llmroute.testing import Simulator

    toml = _readme_block("# llmroute.toml\n[models.chat]")
    code = _readme_block("# examples/one_key.py\n").removeprefix("# examples/one_key.py\n")
    assert code in (ROOT / "examples" / "one_key.py").read_text()
    path = tmp_path / "llmroute.toml"
    path.write_text(toml)
    config = load_config(path)
    assert config is not None
    resolved = resolve(config, environ={"OPENAI_API_KEY": "sk-only-this-one"})
    assert list(resolved.providers) == ["openai"] and len(resolved.routes["chat"]) == 2
    with Simulator(tls=True) as sim:
        offline = tmp_path / "offline.toml"
        offline.write_text(f'{toml}\n[providers.openai]\nbase_url = "{sim.base_url}"\n')
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env.update(OPENAI_API_KEY="sk-only-this-one", SSL_CERT_FILE=sim.ca_pem_path)
        env.pop("LLMROUTE_CONFIG", None)
        done = subprocess.run(
            [sys.executable, "examples/one_key.py", str(offline)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
        )
        shell = _readme_block("export OPENAI_API_KEY=sk-...\n")
        assert ".venv/bin/llmroute chat --config llmroute.toml --show-route" in shell
        argv = ["chat", "--config", str(offline), "--show-route", "Hello!"]
        chat = subprocess.run(  # the README's command line, over the same config
            [sys.executable, "-m", "llmroute", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"-> openai:gpt-\S+, first token after \d+ ms", done.stdout)) == 3
    assert "TTFT p50" in done.stdout  # client.stats() printed as a table
    assert chat.returncode == 0, chat.stderr
    assert re.search(r"route 'chat' \(hedge\): winner openai:\S+", chat.stderr), chat.stderr


def test_readme_simulated_config_runs_without_a_key(tmp_path: Path) -> None:
    """The README's keyless config (three providers of kind "simulator"), saved as the README
    says, serves examples/one_key.py and ``llmroute chat --config`` with no API key, no
    SSL_CERT_FILE and no address or CA copied into it: the client starts the simulators."""
    import os

    toml = _readme_block("# llmroute.toml: three simulated providers, no key\n")
    shell = _readme_block(".venv/bin/llmroute chat --config llmroute.toml --show-route")
    assert "examples/one_key.py llmroute.toml" in shell
    (tmp_path / "llmroute.toml").write_text(toml)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    for name in ("LLMROUTE_CONFIG", "SSL_CERT_FILE", "OPENAI_BASE_URL"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    one_key = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "one_key.py"), "llmroute.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    argv = ["chat", "--config", "llmroute.toml", "--show-route", "Hello!"]
    chat = subprocess.run(
        [sys.executable, "-m", "llmroute", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert one_key.returncode == 0, one_key.stderr
    found = re.findall(
        r"-> (fast|steady|flaky):sim-small, first token after \d+ ms", one_key.stdout
    )
    assert len(found) == 3, one_key.stdout
    assert chat.returncode == 0, chat.stderr
    assert re.search(r"route 'chat' \(hedge\): winner (fast|steady|flaky):sim-small", chat.stderr)


def test_readme_gateway_in_three_commands() -> None:
    """The README's three commands: install, ``llmroute serve --simulator``, then the line it
    prints, pasted: openai's client gets a routed answer and the target that gave it. (Here on
    any free port, and the installed interpreter stands in for .venv/bin/.)"""
    import os
    import select
    import shlex
    import time

    block = _readme_block("python3 -m venv .venv && .venv/bin/pip install -e '.[all]'   # once")
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and "# in a second terminal, paste that line" in block
    assert commands[1].split("#")[0].split() == [".venv/bin/llmroute", "serve", "--simulator"]
    env = {
        k: v for k, v in os.environ.items() if k not in ("LLMROUTE_CONFIG", "LLMROUTE_GATEWAY_KEY")
    }
    serve = [sys.executable, "-m", "llmroute", "serve", "--simulator", "--port", "0"]
    proc = subprocess.Popen(
        serve,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 60  # a hang guard only
        while b"Ctrl-C" not in seen:  # bounded: 60 s, and a closed pipe ends it
            readable, _, _ = select.select(
                [proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            chunk = os.read(proc.stdout.fileno(), 65536) if readable else b""
            assert chunk, seen
            seen += chunk
        pasted = next(line for line in seen.decode().splitlines() if line.startswith("or:"))
        argv = shlex.split(pasted.removeprefix("or:"))
        assert argv[:2] == [sys.executable, "-c"] and "from openai import OpenAI" in argv[2]
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False
        )
        assert done.returncode == 0, done.stderr
        answer, _, target = done.stdout.strip().rpartition(" -> ")
        assert answer and target in {
            f"{n}:sim-small" for n in ("fast-but-spiky", "steady-slow", "flaky")
        }
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
