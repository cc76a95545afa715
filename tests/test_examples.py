"""The README's quickstart and `make demo` run as written (real subprocesses)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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

    from llmroute._config import load_config, resolve
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
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"-> openai:gpt-\S+, first token after \d+ ms", done.stdout)) == 3
    assert "TTFT p50" in done.stdout  # client.stats() printed as a table
