"""The SGLang stand-in as the launcher meets it: real processes started with SGLang's command lines
(``python -m sglang.launch_server`` and ``python -m sglang.cli.main serve``) from PYTHONPATH."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmroute.testing import sglang_standin_path
from llmroute.testing._sglang import StandInKnobs, group_alive, supported_flags

KEY = "sk-standin-0123456789"
MODEL_PATH = "Qwen/Qwen2.5-0.5B-Instruct"
READY_LINE = "The server is fired up and ready to roll!"
COMMANDS = {
    "launch_server": [sys.executable, "-m", "sglang.launch_server"],
    "serve": [sys.executable, "-m", "sglang.cli.main", "serve"],
}


def standin_env(version: str | None = None, **knobs: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_STANDIN_")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [sglang_standin_path(), env.get("PYTHONPATH")])
    )
    if version is not None:
        env["SGLANG_STANDIN_VERSION"] = version
    env.update(StandInKnobs(**knobs).to_env())
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=30, check=False)


BOUND = "Uvicorn running on"
BIND_FAILED = "Failed to bind"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def group_members(pgid: int) -> list[int]:
    """Running (not zombie) processes of the group, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


class StandIn:
    """One stand-in server process, in its own process group, logging to a file."""

    def __init__(
        self,
        log_dir: Path,
        entry: str = "serve",
        version: str | None = None,
        flags: tuple[str, ...] = (),
        **knobs: Any,
    ) -> None:
        # A free port can be taken (by any process's outgoing connection) before the server
        # binds it: the server then logs "Failed to bind" and exits, and it is started again
        # on another port. Waiting for its own "Uvicorn running" line also means that what
        # answers on the port is this server, not whoever took it.
        for _ in range(5):
            self.port = free_port()
            self.log_path = log_dir / f"sglang-{self.port}.log"
            command = [*COMMANDS[entry], "--model-path", MODEL_PATH, "--port", str(self.port)]
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    [*command, *flags],
                    env=standin_env(version, **knobs),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pgid = self.proc.pid
            wait_for(self._started, 30, "the server to bind its port, fail to, or exit")
            if BIND_FAILED not in self.log():
                break
            self.proc.wait(10)
        else:
            raise RuntimeError(f"the stand-in found no free port in 5 tries: {self.log()}")
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.base_url, timeout=10)

    def _started(self) -> bool:
        log = self.log()
        return BOUND in log or BIND_FAILED in log or self.proc.poll() is not None

    def log(self) -> str:
        return self.log_path.read_text()

    def status(self, path: str, **kw: Any) -> int | None:
        try:
            return self.http.get(path, **kw).status_code
        except httpx.TransportError:
            return None

    def wait_listening(self) -> None:
        wait_for(lambda: self.status("/health") is not None, what="the server to listen")

    def wait_ready(self) -> None:
        wait_for(lambda: self.status("/health_generate") == 200, what="/health_generate 200")

    def close(self) -> None:
        self.http.close()
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    """A 0.5.5 server started as `sglang serve` with the launcher's TTFT-oriented flags."""
    flags = (
        "--served-model-name=standin",
        "--api-key",
        KEY,
        "--enable-metrics",
        "--enable-cache-report",
        "--schedule-policy",
        "lpm",
        "--max-running-requests",
        "2",
        "--tp",
        "1",
    )
    standin = StandIn(
        tmp_path_factory.mktemp("sglang"), flags=flags, warmup=0.2, prefill_ms_per_1k=100.0
    )
    try:
        standin.wait_ready()
        yield standin
    finally:
        standin.close()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def system_prompt(seed: str, words: int = 1500) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega")) for _ in range(words))


def sse_events(response: httpx.Response) -> Iterator[Any]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield data if data == "[DONE]" else json.loads(data)


# -- command line ------------------------------------------------------------------------------
def test_version_comes_from_env_without_heavy_imports() -> None:
    heavy = "sorted(sys.modules.keys() & {'llmroute', 'hypercorn', 'asyncio'})"
    code = f"import sglang, sys; print(sglang.__version__, {heavy})"
    assert run([sys.executable, "-c", code], standin_env()).stdout == "0.5.5 []\n"
    assert run([sys.executable, "-c", code], standin_env("0.4.0")).stdout == "0.4.0 []\n"


def test_old_version_rejects_newer_flags() -> None:
    args = [*COMMANDS["launch_server"], "--model-path", MODEL_PATH, "--enable-cache-report"]
    done = run(args, standin_env("0.3.0"))
    assert done.returncode == 2
    assert "unrecognized arguments: --enable-cache-report" in done.stderr


@pytest.mark.parametrize("version", ["0.3.0", "0.5.4"])
def test_serve_cli_is_missing_before_0_5_5(version: str) -> None:
    done = run([*COMMANDS["serve"], "--model-path", MODEL_PATH], standin_env(version))
    assert done.returncode == 1
    assert "No module named 'sglang.cli'" in done.stderr


@pytest.mark.parametrize(
    ("entry", "version", "has_cache_report"),
    [("launch_server", "0.3.0", False), ("launch_server", "0.4.0", True), ("serve", "0.5.5", True)],
)
def test_help_lists_exactly_the_supported_flags(
    entry: str, version: str, has_cache_report: bool
) -> None:
    done = run([*COMMANDS[entry], "--help"], standin_env(version))
    assert done.returncode == 0
    listed = set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))
    assert listed == {*supported_flags(version), "--help"}
    assert ("--enable-cache-report" in listed) is has_cache_report
    assert {"--model-path", "--schedule-policy", "--tp-size", "--disable-radix-cache"} <= listed


def test_cli_main_callable_and_real_no_guard_behaviour() -> None:
    call_main = "from sglang.cli.main import main; main()"
    done = run([sys.executable, "-c", call_main, "serve", "--help"], standin_env())
    assert done.returncode == 0
    assert "Usage: sglang serve" in done.stdout
    assert "--enable-cache-report" in done.stdout
    # Real SGLang's cli/main.py has no __main__ guard: `python -m` runs nothing and exits 0.
    env = {**standin_env(), "SGLANG_STANDIN_CLI_MAIN_GUARD": "0"}
    done = run([*COMMANDS["serve"], "--model-path", MODEL_PATH], env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


# -- readiness ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("entry", "version"), [("launch_server", "0.4.0"), ("serve", "0.5.5")])
def test_warm_up_gates_health_generate_but_not_models(
    tmp_path: Path, entry: str, version: str
) -> None:
    standin = StandIn(tmp_path, entry, version, warmup=1.5)
    try:
        wait_for(lambda: standin.status("/v1/models") == 200, what="/v1/models")
        assert standin.status("/health_generate") == 503
        assert standin.status("/health") == (503 if version == "0.5.5" else 200)
        assert READY_LINE not in standin.log()
        # A chat request sent now is served only after the warm-up.
        chat = {"model": "m", "messages": [{"role": "user", "content": "early"}]}
        assert standin.http.post("/v1/chat/completions", json=chat).status_code == 200
        assert standin.status("/health_generate") == 200
        log = standin.log()
        assert log.index("server_args=ServerArgs(model_path=") < log.index(READY_LINE)
        assert log.index(READY_LINE) < log.index("Prefill batch")
        assert standin.status("/metrics") == 404  # no --enable-metrics
        info = standin.http.get("/get_server_info").json()
        assert (info["port"], info["version"]) == (standin.port, version)
    finally:
        standin.close()


# -- the OpenAI-compatible API -----------------------------------------------------------------
def test_chat_stream_and_non_stream_through_openai(server: StandIn) -> None:
    messages: Any = [{"role": "user", "content": "Tell me about warm pools."}]
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["standin"]
        reply = client.chat.completions.create(model="standin", messages=messages)
        stream = client.chat.completions.create(
            model="standin",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = reply.choices[0].message.content
    assert text and reply.model == "standin" and reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens


def stream_usage(server: StandIn, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The usage of a streamed answer's final chunk, once a content token came first."""
    body = {
        "model": "standin",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    content, usage = False, None
    with server.http.stream("POST", "/v1/chat/completions", json=body, headers=auth()) as resp:
        for event in sse_events(resp):
            if event == "[DONE]":
                break
            if event["choices"] and event["choices"][0]["delta"]["content"]:
                content = True
            usage = event["usage"] or usage
    assert content and usage is not None
    return usage


def test_prefix_cache_hits_and_cuts_prefill(server: StandIn) -> None:
    system = {"role": "system", "content": system_prompt("prefix-cache")}
    usage1 = stream_usage(server, [system, {"role": "user", "content": "First question?"}])
    usage2 = stream_usage(server, [system, {"role": "user", "content": "Second one?"}])
    assert usage1["prompt_tokens_details"] is None  # SGLang sends null, not 0, on a miss
    assert usage2["prompt_tokens_details"]["cached_tokens"] >= 1500
    # The prefill (and with it the TTFT, by SGLANG_STANDIN_PREFILL_MS_PER_1K) is paid only for
    # uncached tokens: counted, not timed.
    uncached2 = usage2["prompt_tokens"] - usage2["prompt_tokens_details"]["cached_tokens"]
    assert uncached2 <= usage1["prompt_tokens"] - 1500
    # The next turn (with the reply) hits beyond the system prompt; a flush forgets it all.
    assert server.http.post("/flush_cache", headers=auth()).status_code == 200
    usage3 = stream_usage(server, [system, {"role": "user", "content": "Second one?"}])
    assert usage3["prompt_tokens_details"] is None


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    """A server with 512-token cache pages and four tokens a streamed event."""
    flags = ("--page-size", "512", "--stream-interval", "4", "--served-model-name=m")
    standin = StandIn(tmp_path_factory.mktemp("paged"), flags=("--enable-cache-report", *flags))
    try:
        standin.wait_ready()
        yield standin
    finally:
        standin.close()


def test_the_page_size_is_the_prefix_caches_block(paged: StandIn) -> None:
    """With --page-size above 1, a prefix is cached in whole pages, as SGLang's paged radix
    cache matches it: two prompts sharing 1,505 tokens share 1,024 (two 512-token pages)."""
    system = {"role": "system", "content": system_prompt("pages")}  # 1,503 tokens rendered
    cached = []
    for question in ("First?", "Second?"):
        body = {"model": "m", "messages": [system, {"role": "user", "content": question}]}
        usage = paged.http.post("/v1/chat/completions", json=body).json()["usage"]
        cached.append((usage["prompt_tokens_details"] or {}).get("cached_tokens", 0))
    assert cached == [0, 1024]


def test_the_stream_interval_is_the_tokens_of_an_event(paged: StandIn) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Ten tokens, please."}],
        "stream": True,
        "max_tokens": 10,
    }
    with paged.http.stream("POST", "/v1/chat/completions", json=body) as resp:
        events = [e for e in sse_events(resp) if e != "[DONE]"]
    texts = [e["choices"][0]["delta"]["content"] for e in events if e["choices"]]
    pieces = [text for text in texts if text]
    assert [len(text.split()) for text in pieces] == [4, 4, 2]  # ten tokens, four an event
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_multi_turn_hits_the_previous_reply(server: StandIn) -> None:
    system = {"role": "system", "content": system_prompt("multi-turn", 200)}
    turn1 = [system, {"role": "user", "content": "Hello"}]
    reply = server.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": turn1}, headers=auth()
    ).json()
    answer = reply["choices"][0]["message"]
    turn2 = [*turn1, {"role": "assistant", "content": answer["content"]}]
    turn2.append({"role": "user", "content": "And then?"})
    usage = server.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": turn2}, headers=auth()
    ).json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > reply["usage"]["prompt_tokens"]  # turn 1's prompt and (part of) its reply
    assert reply["model"] == "m"  # SGLang echoes the request's model name


def test_in_stream_error_event(server: StandIn) -> None:
    body = {"model": "standin", "messages": [{"role": "user", "content": "x"}], "stream": True}
    headers = {**auth(), "x-sim-fault": "stream-error:2"}
    with server.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        events = list(sse_events(resp))
    assert [bool(e["choices"][0]["delta"]["content"]) for e in events[:3]] == [False, True, True]
    assert events[3]["error"]["object"] == "error"
    assert (events[3]["error"]["type"], events[3]["error"]["code"]) == ("BadRequestError", 400)
    assert events[4:] == ["[DONE]"]
    with (
        openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0) as client,
        pytest.raises(openai.APIError),
    ):
        for _ in client.chat.completions.create(
            model="standin",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_headers={"x-sim-fault": "stream-error:2"},
        ):
            pass


def test_api_key_rules(server: StandIn) -> None:
    for path in ("/v1/models", "/get_model_info", "/get_server_info"):
        response = server.http.get(path)
        assert (response.status_code, response.json()) == (401, {"error": "Unauthorized"})
        assert server.status(path, headers={"Authorization": "Bearer wrong"}) == 401
    for path in ("/health", "/health_generate", "/metrics"):
        assert server.status(path) == 200
    info = server.http.get("/get_server_info", headers=auth())
    assert info.json()["api_key"] is None and info.json()["version"] == "0.5.5"
    assert KEY not in info.text
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


# -- metrics -----------------------------------------------------------------------------------
def parse_metrics(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """(TYPE of each family, samples as (name, labels, value)); raises on a malformed line."""
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
            assert match, line
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[2] or ""))
            samples.append((match[1], labels, float(match[3])))
    return types, samples


def metric(samples: list[tuple[str, dict[str, str], float]], name: str) -> float:
    return next(value for n, labels, value in samples if n == name and "le" not in labels)


def test_metrics_names_types_and_labels(server: StandIn) -> None:
    stream_usage(server, [{"role": "user", "content": "metrics please"}])
    response = server.http.get("/metrics")  # no key needed
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, samples = parse_metrics(response.text)
    for name in ("num_queue_reqs", "num_running_reqs", "cache_hit_rate", "token_usage"):
        assert types[f"sglang:{name}"] == "gauge"
    for name in ("time_to_first_token_seconds", "queue_time_seconds"):
        assert types[f"sglang:{name}"] == "histogram"
    for name in ("prompt_tokens_total", "generation_tokens_total", "cached_tokens_total"):
        assert types[f"sglang:{name}"] == "counter"
    assert all(labels["model_name"] == "standin" for _, labels, _ in samples)
    assert metric(samples, "sglang:prompt_tokens_total") > 0
    assert metric(samples, "sglang:generation_tokens_total") >= 16
    buckets = [
        (labels["le"], value)
        for name, labels, value in samples
        if name == "sglang:time_to_first_token_seconds_bucket"
    ]
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == "+Inf"
    assert counts[-1] == metric(samples, "sglang:time_to_first_token_seconds_count") > 0


def test_queue_depth_under_load(server: StandIn) -> None:
    """--max-running-requests 2: of four slow requests, two wait in the queue."""

    def chat(i: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": f"load {i}"}]}
        headers = {**auth(), "x-sim-fault": "slow:0.6"}
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            return http.post("/v1/chat/completions", json=body, headers=headers).status_code

    def gauges() -> tuple[float, float]:
        _, samples = parse_metrics(server.http.get("/metrics").text)
        return metric(samples, "sglang:num_running_reqs"), metric(samples, "sglang:num_queue_reqs")

    _, before = parse_metrics(server.http.get("/metrics").text)
    with ThreadPoolExecutor(4) as pool:
        results = pool.map(chat, range(4))
        wait_for(lambda: gauges() == (2, 2), what="2 running and 2 queued")
        assert list(results) == [200] * 4
    _, after = parse_metrics(server.http.get("/metrics").text)
    # Every request's queue time was recorded, and the two that were seen queued waited some:
    # how long depends on when a loaded machine started each thread, so it is not asserted.
    queued = metric(after, "sglang:queue_time_seconds_count")
    assert queued - metric(before, "sglang:queue_time_seconds_count") == 4
    waited = metric(after, "sglang:queue_time_seconds_sum")
    assert waited > metric(before, "sglang:queue_time_seconds_sum")
    assert gauges() == (0, 0)


# -- process lifecycle -------------------------------------------------------------------------
def test_exit_after_logs_oom_and_exits_1(tmp_path: Path) -> None:
    standin = StandIn(tmp_path, "launch_server", warmup=10, exit_after=0.3, children=2)
    try:
        assert standin.proc.wait(10) == 1
        log = standin.log()
        assert "torch.OutOfMemoryError: CUDA out of memory" in log
        assert READY_LINE not in log
        with pytest.raises(ProcessLookupError):
            os.killpg(standin.pgid, 0)
    finally:
        standin.close()


@pytest.mark.parametrize("target", ["group", "leader"])
def test_sigterm_leaves_no_process(tmp_path: Path, target: str) -> None:
    standin = StandIn(tmp_path, children=2, warmup=0.1, drain=0.2)
    try:
        standin.wait_ready()
        assert len(group_members(standin.pgid)) == 3  # the server and its two children
        if target == "group":
            os.killpg(standin.pgid, signal.SIGTERM)
        else:
            os.kill(standin.proc.pid, signal.SIGTERM)
        assert standin.proc.wait(10) == 0

        def gone() -> bool:
            try:
                os.killpg(standin.pgid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, 30, "the process group to disappear")
        assert "Received SIGTERM" in standin.log()
    finally:
        standin.close()


def test_ignored_sigterm_needs_sigkill(tmp_path: Path) -> None:
    standin = StandIn(tmp_path, children=1, warmup=0.1, ignore_sigterm=True)
    try:
        standin.wait_ready()
        os.killpg(standin.pgid, signal.SIGTERM)
        # The server says it received and ignored the signal (rather than a fixed sleep after
        # which a slow machine may not have delivered it yet).
        wait_for(lambda: "SIGTERM: ignored" in standin.log(), 30, "the SIGTERM to be ignored")
        assert standin.proc.poll() is None
        assert len(group_members(standin.pgid)) == 2
        assert standin.status("/health_generate") == 200
        os.killpg(standin.pgid, signal.SIGKILL)
        assert standin.proc.wait(10) == -signal.SIGKILL
        # Orphaned children may stay zombies where PID 1 reaps nothing: group_alive ignores them.
        wait_for(lambda: not group_alive(standin.pgid), 30, "the process group to die")
    finally:
        standin.close()


def test_grandchild_outlives_its_server_until_the_group_is_signalled(tmp_path: Path) -> None:
    assert StandInKnobs.from_env({"SGLANG_STANDIN_GRANDCHILD": "1"}).grandchild
    assert StandInKnobs(grandchild=True).to_env()["SGLANG_STANDIN_GRANDCHILD"] == "1"
    standin = StandIn(tmp_path, children=1, warmup=0.1, grandchild=True)
    try:
        standin.wait_ready()

        def grandchildren() -> list[int]:
            found = []
            for pid in group_members(standin.pgid):
                try:
                    if b"sglang::grandchild" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(pid)
                except OSError:
                    pass
            return found

        wait_for(lambda: len(group_members(standin.pgid)) == 3, 30, "server, child, grandchild")
        (grandchild,) = grandchildren()
        os.kill(standin.proc.pid, signal.SIGKILL)  # the server alone
        assert standin.proc.wait(10) == -signal.SIGKILL
        # Its child dies with it (PDEATHSIG); the grandchild stays, in the same group.
        wait_for(lambda: group_members(standin.pgid) == [grandchild], 30, "the child to die")
        time.sleep(0.3)
        assert group_members(standin.pgid) == [grandchild]
        os.killpg(standin.pgid, signal.SIGTERM)
        wait_for(lambda: not group_alive(standin.pgid), 30, "the grandchild to die")
    finally:
        standin.close()
