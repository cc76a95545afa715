"""The command line's conventions, held to ``gh``, ``uv`` and ``httpie``: a bare command prints
its help, a misspelt subcommand, choice or flag gets a did-you-mean, ``--debug`` works after the
subcommand, every command that prints a table has ``--json`` (one JSON document on stdout,
nothing else there), shell completion comes from the parser, and every ``--help`` has examples."""

from __future__ import annotations

import http.server
import json
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llmroute.cli import _cache, build_parser, main
from llmroute.cli._completion import script
from llmroute.cli._parser import walk
from llmroute.testing import Simulator

from ..conftest import KEY

COMMANDS = {
    "demo",
    "bench",
    "chat",
    "serve",
    "sim",
    "cache",
    "sglang",
    "doctor",
    "tiers",
    "top",
    "keys",
    "completion",
}

TABLE_COMMANDS = {("bench",), ("cache",), ("chat",), ("doctor",), ("tiers", "eval"), ("top",)}
"""The commands that print a table (or a report) and so take ``--json``. ``demo`` is a live
show of tables, not data: ``bench --routed --json`` gives its figures."""
KEYS_COMMANDS = {
    ("keys", action) for action in ("create", "show", "update", "rotate", "revoke", "team")
}
"""``llmroute keys``'s commands that print the gateway's answer (``--json``: its JSON);
``keys list`` and ``keys teams`` print tables."""
TABLE_COMMANDS |= {("keys", "list"), ("keys", "teams")}
JSON_COMMANDS = {*TABLE_COMMANDS, ("sim",), *KEYS_COMMANDS}
"""Every command with ``--json``: those above, ``sim`` (its addresses) and ``keys``'s."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def paths() -> list[tuple[str, ...]]:
    return [path for path, _ in walk(build_parser())]


# -- bare invocation and suggestions ---------------------------------------------------------------


def test_bare_llmroute_prints_its_help_on_stderr_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As uv does: the help, then which commands there are; status 2 (a usage mistake), and
    nothing on stdout for a script to mistake for output."""
    status, out, err = run(capsys)
    assert (status, out) == (2, "")
    assert err.startswith("usage: llmroute ")
    assert "examples:\n  llmroute demo" in err
    for command in COMMANDS:
        assert f"    {command}" in err
    assert err.rstrip().endswith("llmroute: error: give a command: " + ", ".join(_order()))


def _order() -> list[str]:
    return [path[0] for path in paths() if len(path) == 1]


@pytest.mark.parametrize(("argv", "choices"), [(["sglang"], "launch"), (["tiers"], "fit, eval")])
def test_a_group_without_its_subcommand_prints_its_help(
    capsys: pytest.CaptureFixture[str], argv: list[str], choices: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert (status, out) == (2, "")
    assert err.startswith(f"usage: llmroute {argv[0]} ")
    assert err.rstrip().endswith(f"give a command: {choices}")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["chta", "hello"], "invalid choice: 'chta'"),
        (["sglang", "lanch", "m"], "invalid choice: 'lanch'"),
        (["top", "--sort", "shar", "x"], "invalid choice: 'shar'"),
        (["cache", "stats", "--jsn"], "unrecognized arguments: --jsn"),
        (["chat", "hi", "--mdoel", "x"], "unrecognized arguments: --mdoel x"),
        (["sglang", "launch", "m", "--dry-rn"], "unrecognized arguments: --dry-rn"),
    ],
)
def test_a_misspelt_subcommand_choice_or_flag_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert (status, out) == (2, "")
    line = err.strip().splitlines()[-1]
    assert said in line
    suggestions = {
        "chta": "did you mean 'chat'?",
        "lanch": "did you mean 'launch'?",
        "shar": "did you mean 'share'?",
        "--jsn": "; did you mean --json?",
        "--mdoel": "(--mdoel: did you mean --model?)",
        "--dry-rn": "; did you mean --dry-run?",
    }
    wrong = next(word for word in argv if word in suggestions)
    assert line.endswith(suggestions[wrong]), line
    # The usage shown is the subcommand's own, where the mistake was made.
    depth = {"chta": 0, "lanch": 1}.get(wrong, 2 if argv[0] == "sglang" else 1)
    assert err.startswith("usage: " + " ".join(["llmroute", *argv[:depth]]) + " ")


def test_a_word_far_from_every_command_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "zzzzzz")
    assert status == 2 and "invalid choice: 'zzzzzz'" in err and "did you mean" not in err


# -- --debug ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_works_before_or_after_the_subcommand(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    async def broken(*_: Any) -> int:
        raise RuntimeError("an unforeseen case")

    monkeypatch.setattr(_cache, "_cache_command", broken)
    status, _, err = run(capsys, "cache", "stats")
    assert status == 1 and "unexpected error: RuntimeError: an unforeseen case" in err
    argv = ["--debug", "cache", "stats"] if where == "before" else ["cache", "stats", "--debug"]
    with pytest.raises(RuntimeError, match="an unforeseen case"):
        main(argv)


# -- --json ----------------------------------------------------------------------------------------


def test_every_command_that_prints_a_table_takes_json() -> None:
    """And no other command has one untested here (a new one must join TABLE_COMMANDS)."""
    with_json = {path for path, parser in walk(build_parser()) if _flags(parser) & {"--json"}}
    assert with_json == JSON_COMMANDS


def _flags(parser: Any) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def only_json(out: str) -> Any:
    """stdout holds one JSON document and nothing else."""
    document, end = json.JSONDecoder().raw_decode(out)
    assert out[end:].strip() == "", out[end:]
    return document


def test_chat_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "chat", "--simulator", "hello", "--json")
    assert (status, err) == (0, "")
    document = only_json(out)
    assert document["content"] and document["error"] is None
    assert document["route"]["route"] == "chat" and document["route"]["winner"]
    assert document["timings"]["first_token"] > 0
    # the cost at the demo's prices, exact: amounts as decimal strings, each attempt's too
    cost = document["route"]["cost"]
    assert cost["currency"] == "USD" and Decimal(cost["amount"]) > 0
    assert "pricer" not in document["route"]
    attempts = document["route"]["attempts"]
    assert sum(Decimal(a["cost"]["amount"]) for a in attempts) == Decimal(cost["amount"])


def test_doctor_json(sim: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(
        f'[providers.p]\nbase_url = "{sim.base_url}"\napi_key = "{KEY}"\n'
        '[models.chat]\ntargets = ["p:sim-small"]\n'
    )
    argv = ["doctor", "--config", str(config), "--probes", "1", "--ca", sim.ca_pem_path, "--json"]
    status, out, err = run(capsys, *argv)
    assert (status, err) == (0, "")
    (row,) = only_json(out)["targets"]
    assert row["target"] == "p:sim-small" and row["error"] is None and row["client_ttft"] > 0


def test_bench_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--simulator", "--probes", "1", "--lengths", "short", "--json"]
    status, out, err = run(capsys, *argv)
    assert status == 0
    document = only_json(out)
    assert len(document["samples"]) == 3 and len(document["summary"]) == 3
    assert "Time to first token per target" in err  # the tables went to stderr


def test_cache_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "llmroute.toml"
    config.write_text(f'[cache]\nbackend = "disk"\npath = "{tmp_path / "cache"}"\n')
    status, out, err = run(capsys, "cache", "stats", "--config", str(config), "--json")
    assert (status, err) == (0, "")
    assert only_json(out)["entries"] == 0


def test_tiers_eval_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wordllama")  # the tiers extra
    data = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
    argv = ["tiers", "eval", str(data), "--folds", "2", "--no-embedding", "--json"]
    status, out, _ = run(capsys, *argv)
    assert status == 0
    assert 0 <= only_json(out)["accuracy"] <= 1


RECORDED = """\
# TYPE llmroute_attempts_total counter
llmroute_attempts_total{outcome="won",reason="first",target="a:m"} 4.0
# TYPE llmroute_in_flight gauge
llmroute_in_flight{target="a:m"} 0.0
# TYPE llmroute_requests_total counter
llmroute_requests_total{outcome="ok",route="chat",source="live"} 4.0
"""


@pytest.fixture
def metrics_page() -> Iterator[str]:
    """A page serving recorded exposition text, on loopback."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = RECORDED.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)  # a hang guard only


def test_top_json_prints_one_frame(metrics_page: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "top", "--json", metrics_page)  # --json implies --once
    assert (status, err) == (0, "")
    document = only_json(out)
    assert document["source"] == metrics_page and document["seconds"] is None
    (target,) = document["targets"]
    assert (target["name"], target["answers"], target["share"]) == ("a:m", 4, 1.0)
    assert document["routes"][0]["requests"] == 4


def test_sim_json_is_one_document() -> None:
    """``llmroute sim --json`` prints its simulators as one JSON document as soon as they
    listen, then serves until a signal (status 0), nothing more on stdout."""
    import os
    import select
    import signal
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "llmroute", "sim", "--no-tls", "--json"]
    argv += ["--profile", "a=instant", "--profile", "b=flaky"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a hang guard only
        assert ready
        line = proc.stdout.readline().decode()
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    document = only_json(line + rest.decode())
    assert [s["name"] for s in document["simulators"]] == ["a", "b"]
    assert all(s["base_url"].startswith("http://127.0.0.1:") for s in document["simulators"])


# -- completion ------------------------------------------------------------------------------------


def test_bash_completion_names_every_subcommand_and_parses(tmp_path: Path) -> None:
    text = script("bash", build_parser())
    for path in paths():
        if path:
            assert f"'/{'/'.join(path)}'" in text, path
    file = tmp_path / "llmroute.bash"
    file.write_text(text)
    bash = shutil.which("bash")
    assert bash is not None
    checked = subprocess.run([bash, "-n", str(file)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    # And it completes: words, nested subcommands, a flag's choices, files for a path.
    probe = f"""
source {shlex.quote(str(file))}
ask() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _llmroute
        echo "${{COMPREPLY[*]}}"; }}
ask llmroute to
ask llmroute sglang ''
ask llmroute --debug top --sort ''
ask llmroute sglang launch m --dry
ask llmroute bench --plot ''
"""
    done = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "top",
        "launch --help --debug",
        "share p95 errors name",
        "--dry-run",
        "",
    ]


def test_completion_command_prints_each_shell_s_script(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for shell in ("bash", "zsh", "fish"):
        status, out, err = run(capsys, "completion", shell)
        assert (status, err) == (0, "")
        for command in COMMANDS:
            assert command in out
    status, out, err = run(capsys, "completion", "zsh")
    assert out.startswith("#compdef llmroute\n") and "bashcompinit" in out
    status, out, _ = run(capsys, "completion", "fish")
    assert "complete -c llmroute -n __fish_use_subcommand -a 'chat'" in out
    assert "-l sort -x -a 'share p95 errors name'" in out
    status, _, err = run(capsys, "completion", "bsh")
    assert status == 2 and "did you mean 'bash'?" in err


# -- --help ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", paths(), ids=lambda path: " ".join(path) or "llmroute")
def test_every_help_has_examples_that_parse(path: tuple[str, ...]) -> None:
    parsers = dict(walk(build_parser()))
    text = parsers[path].format_help()
    assert "\nexamples:\n" in text, text
    lines = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines()]
    commands = [line for line in lines if line.startswith("llmroute ")]
    assert len(commands) >= 2, lines
    for line in commands:
        words: list[str] = []
        for word in shlex.split(line, comments=True)[1:]:
            if word in (">", "|", "--"):
                break
            words.append(word)
        if path:  # a command's examples are of that command
            assert words[: len(path)] == list(path), line
        build_parser().parse_args(words)  # a real command line: it parses
