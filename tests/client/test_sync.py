"""The sync client: the async one on a private event loop thread, reached through proxies."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import anyio.lowlevel
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import llmroute
from llmroute._sync import ClientClosedError, Stream
from llmroute.testing import Simulator

from ..conftest import KEY
from ..settle import settled_sync

MESSAGES = [{"role": "user", "content": "Hello from a thread"}]


def sync_client(sim: Simulator, **kwargs: Any) -> llmroute.OpenAI:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("base_url", sim.base_url)
    return llmroute.OpenAI(verify=sim.ssl_context(), **kwargs)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "llmroute-loop"]


@pytest.fixture
def client(sim: Simulator) -> Iterator[llmroute.OpenAI]:
    with sync_client(sim) as client:
        yield client


def async_results(sim: Simulator) -> tuple[str, str]:
    async def main() -> tuple[str, str]:
        async with llmroute.AsyncOpenAI(
            api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()
        ) as client:
            done = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
            stream = await client.chat.completions.create(
                model="sim-small", messages=MESSAGES, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            return done.choices[0].message.content or "", text

    return anyio.run(main)


def test_create_matches_the_async_client(sim: Simulator, client: llmroute.OpenAI) -> None:
    done = client.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert isinstance(done, ChatCompletion)
    stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
    assert isinstance(stream, Stream)
    chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (done.choices[0].message.content, text) == async_results(sim)
    assert stream.response.status_code == 200
    assert stream.timings.first_token is not None and stream.timings.tokens == 20
    assert stream.route is None


def test_attributes_and_repr(sim: Simulator, client: llmroute.OpenAI) -> None:
    assert client.api_key == KEY
    assert str(client.base_url) == sim.base_url.rstrip("/") + "/"
    assert client.max_retries == 2
    assert "llmroute.OpenAI" in repr(client) and KEY not in repr(client)
    client.warmup()
    assert client.stats() == {}


def test_with_blocks_and_close_reset_the_stream(sim: Simulator, sim_slow: Simulator) -> None:
    with sync_client(sim_slow) as client:
        settled_sync(sim_slow)  # an earlier test's reset lands before we count
        before = sim_slow.stats()["streams_cancelled"]
        with client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        ) as stream:
            for _ in zip(range(3), stream, strict=False):
                pass
        stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
        for _ in stream:
            break
        stream.close()
        stream.close()  # idempotent
        assert list(stream) == []
        deadline = time.monotonic() + 30  # a hang guard only
        while sim_slow.stats()["streams_cancelled"] < before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sim_slow.stats()["streams_cancelled"] == before + 2


def test_errors_are_openais(sim: Simulator) -> None:
    with sync_client(sim, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(
                model="sim-small", messages=MESSAGES, extra_headers={"x-sim-fault": "429"}
            )
        assert caught.value.status_code == 429
        stream = client.chat.completions.create(
            model="sim-small",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-sim-fault": "drop:3"},
        )
        with pytest.raises(llmroute.StreamInterrupted), stream:
            for _ in stream:
                pass


def test_constructor_errors() -> None:
    threads = len(loop_threads())
    # Exactly as openai: an unknown argument, a wrong http_client.
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'nonsense'"):
        llmroute.OpenAI(api_key=KEY, nonsense=1)
    try:
        openai.OpenAI(api_key=KEY, http_client=object())  # type: ignore[arg-type]
    except Exception as exc:
        expected: type[Exception] = type(exc)
    with pytest.raises(expected):
        llmroute.OpenAI(api_key=KEY, http_client=object())  # type: ignore[arg-type]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env)
        with pytest.raises(openai.OpenAIError, match="api_key"):
            llmroute.OpenAI()
    assert len(loop_threads()) == threads


def test_routed_config(sim: Simulator) -> None:
    config = {
        "providers": {"a": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["a:sim-small"], "policy": "failover"}},
    }
    with llmroute.OpenAI(config=config, verify=sim.ssl_context()) as client:
        client.warmup()
        done = client.chat.completions.create(model="chat", messages=MESSAGES)
        assert done.route.winner == "a:sim-small"  # type: ignore[attr-defined]
        with client.chat.completions.create(model="chat", messages=MESSAGES, stream=True) as s:
            text = "".join(c.choices[0].delta.content or "" for c in s)
        assert text == done.choices[0].message.content
        assert s.route is not None and s.route.winner == "a:sim-small"
        client.add_provider("b", {"base_url": sim.base_url, "api_key": KEY})
        client.add_targets("other", ["b:sim-small"])
        assert client.chat.completions.create(model="other", messages=MESSAGES).choices
        assert set(client.stats()) == {"a:sim-small", "b:sim-small"}


def test_a_copy_given_a_config_has_its_own_loop_and_routing_state(sim: Simulator) -> None:
    threads = len(loop_threads())
    client = sync_client(sim)
    config = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
    }
    routed = client.copy(config=config)
    assert routed._llmroute is not client._llmroute and routed._client is not client._client
    assert len(loop_threads()) == threads + 2
    done = routed.chat.completions.create(model="chat", messages=MESSAGES)
    assert done.route is not None and done.route.winner == "sim:sim-small"
    assert routed.with_options(max_retries=0)._llmroute is routed._llmroute
    routed.close()  # its own loop and state; the original's stay open
    assert routed.is_closed() and not client.is_closed()
    assert len(loop_threads()) == threads + 1
    assert client.chat.completions.create(model="sim-small", messages=MESSAGES).choices
    client.close()
    assert len(loop_threads()) == threads


def test_copies_share_the_loop_and_close_alone(sim: Simulator) -> None:
    threads = len(loop_threads())
    client = sync_client(sim)
    copy = client.with_options(default_headers={"X-Copy": "1"}, max_retries=0)
    assert copy.max_retries == 0 and client.max_retries == 2
    copy.chat.completions.create(model="sim-small", messages=MESSAGES)
    headers = {k.lower(): v for k, v in sim.last_requests[-1]["headers"].items()}
    assert headers["x-copy"] == "1"
    assert len(loop_threads()) == threads + 1
    copy.close()
    assert copy.is_closed() and not client.is_closed()
    with pytest.raises(ClientClosedError):
        copy.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert client.copy().chat.completions.create(model="sim-small", messages=MESSAGES)
    client.close()
    client.close()
    assert len(loop_threads()) == threads
    with pytest.raises(ClientClosedError):
        client.chat.completions.create(model="sim-small", messages=MESSAGES)


def test_threads_run_concurrently(sim: Simulator) -> None:
    """Eight threads share one client; their requests overlap at the simulator (its peak of
    requests in flight), counted rather than timed, so a loaded machine cannot fail it."""
    threads = len(loop_threads())
    slow = {"x-sim-fault": "slow:0.1"}  # each request lasts 0.1 s or more
    sim.reset_stats()
    already = sim.stats()["in_flight"]  # streams other tests left behind, if any
    with sync_client(sim) as client:

        def work(n: int) -> list[str]:
            texts = []
            for i in range(5):
                if i % 2:
                    done = client.chat.completions.create(
                        model="sim-small", messages=MESSAGES, extra_headers=slow
                    )
                    texts.append(done.choices[0].message.content or "")
                else:
                    with client.chat.completions.create(
                        model="sim-small", messages=MESSAGES, stream=True, extra_headers=slow
                    ) as stream:
                        texts.append("".join(c.choices[0].delta.content or "" for c in stream))
            return texts

        with ThreadPoolExecutor(8) as pool:
            results = [t for texts in pool.map(work, range(8)) for t in texts]
    assert len(results) == 40 and len(set(results)) == 1 and results[0]
    assert sim.stats()["peak_in_flight"] - already >= 2  # one after another: never above 1
    assert len(loop_threads()) == threads


def test_call_from_a_coroutine_works_on_another_loop(client: llmroute.OpenAI) -> None:
    async def main() -> str:
        done = client.chat.completions.create(model="sim-small", messages=MESSAGES)
        return done.choices[0].message.content or ""

    assert anyio.run(main)


def test_a_call_from_the_loop_thread_is_refused(client: llmroute.OpenAI) -> None:
    with pytest.raises(RuntimeError, match="own event loop thread"):
        client._llmroute.call(client.stats)


def test_close_during_a_read_in_another_thread(sim_slow: Simulator) -> None:
    client = sync_client(sim_slow)
    stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
    next(stream)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in stream:
                pass
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.05)
    client.close()
    reader.join(5)
    assert not reader.is_alive() and errors
    assert isinstance(errors[0], ClientClosedError | openai.APIError)


def test_every_endpoint_of_the_async_client(client: llmroute.OpenAI) -> None:
    """openai's sync resources, inherited, over llmroute's transport."""
    text = client.completions.create(model="sim-small", prompt="Hello")
    assert isinstance(text, openai.types.Completion)
    assert all(
        isinstance(c, openai.types.Completion)
        for c in client.completions.create(model="sim-small", prompt="Hello", stream=True)
    )
    embedding = client.embeddings.create(model="sim-small", input="Hello")
    assert isinstance(embedding, openai.types.CreateEmbeddingResponse)
    assert isinstance(embedding.data[0].embedding[0], float)
    page = client.models.list()
    ids = [m.id for m in page]
    assert ids and ids == [m.id for m in page.data] == [m.id for m in client.models.list()]
    raw = client.chat.completions.with_raw_response.create(model="sim-small", messages=MESSAGES)
    assert raw.status_code == 200 and raw.headers["x-request-id"]
    assert isinstance(raw.parse(), ChatCompletion)
    raw = client.chat.completions.with_raw_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    )
    with raw.parse() as stream:
        assert isinstance(stream, Stream) and len(list(stream)) > 20
    with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES
    ) as response:
        assert response.status_code == 200
        assert isinstance(response.parse(), ChatCompletion)
    with client.chat.completions.with_streaming_response.create(
        model="sim-small", messages=MESSAGES, stream=True
    ) as response:
        assert any(line.startswith("data: ") for line in response.iter_lines())


def test_a_dropped_client_and_stream_are_closed(sim_slow: Simulator) -> None:
    threads = len(loop_threads())
    settled_sync(sim_slow)  # an earlier test's reset lands before we count
    before = sim_slow.stats()["streams_cancelled"]
    client = sync_client(sim_slow)
    client.max_retries = 1
    stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
    for _ in stream:
        break
    del stream
    gc.collect()
    deadline = time.monotonic() + 30  # a hang guard only
    while sim_slow.stats()["streams_cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sim_slow.stats()["streams_cancelled"] == before + 1
    del client
    gc.collect()
    assert len(loop_threads()) == threads


def test_unclosed_client_exits_cleanly(sim: Simulator) -> None:
    script = textwrap.dedent(
        f"""
        import ssl, llmroute
        ctx = ssl.create_default_context(cafile={sim.ca_pem_path!r})
        client = llmroute.OpenAI(api_key="k", base_url={sim.base_url!r}, verify=ctx)
        stream = client.chat.completions.create(
            model="sim-small", messages=[{{"role": "user", "content": "hi"}}], stream=True
        )
        next(stream)
        print(client.chat.completions.create(
            model="sim-small", messages=[{{"role": "user", "content": "hi"}}]
        ).choices[0].finish_reason)
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    # No wall-clock bound (a loaded machine): the subprocess timeout catches a hang.
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "stop", "")


def test_a_stream_closed_from_another_thread_stops_its_reader(sim_slow: Simulator) -> None:
    with sync_client(sim_slow) as client:
        settled_sync(sim_slow)  # an earlier test's reset lands before we count
        before = sim_slow.stats()["streams_cancelled"]
        stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
        read: list[Any] = []
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                for chunk in stream:
                    read.append(chunk)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        deadline = time.monotonic() + 30  # a hang guard only
        while len(read) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        stream.close()  # a "stop generating" button, on another thread
        thread.join(5)
        assert not thread.is_alive() and not errors
        assert len(read) < 150  # it stopped early (the reply has 200 tokens)
        deadline = time.monotonic() + 30  # a hang guard only
        while sim_slow.stats()["streams_cancelled"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sim_slow.stats()["streams_cancelled"] == before + 1


def test_a_stream_left_by_a_break_is_reset_without_a_collection(sim_slow: Simulator) -> None:
    with sync_client(sim_slow) as client:
        settled_sync(sim_slow)  # an earlier test's reset lands before we count
        before = sim_slow.stats()["streams_cancelled"]
        stream = client.chat.completions.create(model="sim-small", messages=MESSAGES, stream=True)
        for _ in stream:
            break
        del stream  # no gc.collect(): the drop itself schedules the reset
        deadline = time.monotonic() + 30  # a hang guard only
        while sim_slow.stats()["streams_cancelled"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sim_slow.stats()["streams_cancelled"] == before + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_client_used_after_fork_says_so(sim: Simulator) -> None:
    with sync_client(sim) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
        pid = os.fork()
        if pid == 0:  # the child: its copy of the client has no loop thread
            try:
                client.models.list()
            except ClientClosedError as exc:
                os._exit(0 if "fork()" in str(exc) else 3)
            except BaseException:
                os._exit(5)
            os._exit(4)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0


def test_a_direct_chat_call_is_cached_and_counted(sim: Simulator, tmp_path: Any) -> None:
    config = {"cache": {"backend": "memory", "min_hits": 1}}
    with llmroute.OpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
    ) as client:
        first = client.chat.completions.create(model="sim-small", messages=MESSAGES, temperature=0)
        second = client.chat.completions.create(model="sim-small", messages=MESSAGES, temperature=0)
        assert first.route is None and second.route is not None and second.route.cache_hit
        assert second.choices[0].message.content == first.choices[0].message.content
        streamed = client.chat.completions.create(
            model="sim-small", messages=MESSAGES, temperature=0, stream=True
        )
        assert isinstance(streamed, llmroute.Stream) and [c for c in streamed]
        samples = client.metrics.exposition().decode()
        assert 'source="cache"' in samples


def test_openais_per_request_authentication_is_kept(sim: Simulator) -> None:
    """A workload identity (or a cloud provider) authenticates each request inside openai's
    machinery. A client with a config refused it (llmroute set an ``api_key``, which openai
    will not take beside it), and the sync client's async twin, built from ``api_key`` alone,
    would have sent openai's placeholder ``Bearer workload-identity-auth``: such calls stay on
    openai's path."""
    identity: Any = {
        "identity_provider_id": "idp-test",
        "service_account_id": "sa-test",
        "provider": {"token_type": "jwt", "get_token": lambda: "subject-token"},
    }
    with llmroute.OpenAI(workload_identity=identity, base_url=sim.base_url) as plain:
        assert plain.workload_identity is not None
        assert plain._inner() is None
    config = {"cache": {"backend": "memory"}}
    with llmroute.OpenAI(workload_identity=identity, base_url=sim.base_url, config=config) as c:
        assert c.workload_identity is not None and c._inner() is None
    routed = llmroute.AsyncOpenAI(workload_identity=identity, base_url=sim.base_url, config=config)
    assert routed.workload_identity is not None
    anyio.run(routed.close)


@pytest.mark.parametrize("routed", [True, False], ids=["route", "plain-model"])
def test_the_sync_client_answers_a_hit_before_openais_create_transforms(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch, routed: bool
) -> None:
    """The early cache check on the sync client (chat and Responses): a call with plain JSON
    arguments is looked up on the loop before openai's create() transforms them; a hit sends
    nothing upstream, and a miss is looked up once (not again at the seam)."""
    from openai.resources.chat.completions import completions
    from openai.resources.responses import responses

    serves = {"responses": True, "responses_stored": True}
    config: dict[str, Any] = {"cache": {"backend": "memory", "min_hits": 1}}
    if routed:
        config["providers"] = {"sim": {"base_url": sim.base_url, "api_key": KEY, **serves}}
        config["models"] = {"chat": {"targets": ["sim:sim-small"]}}
        config["routing"] = {"explore": 0}
    model = "chat" if routed else "sim-small"
    with sync_client(sim, config=config) as client:
        cache = client._llmroute.dispatch.cache
        assert cache is not None

        def stored() -> None:
            for _ in range(2000):  # a hang guard only: the store ends on the loop
                if not cache._flights:
                    return
                time.sleep(0.005)
            raise AssertionError("the answer was never stored")

        ask: dict[str, Any] = {"model": model, "messages": MESSAGES, "temperature": 0}
        live = client.chat.completions.create(**ask)
        asked: dict[str, Any] = {"model": model, "input": "Cache me, sync", "temperature": 0}
        if routed:  # Responses for a model that is not a route are openai's alone
            live_events = list(client.responses.create(**asked, stream=True))
        stored()
        through_openai = {"n": 0}

        def counting(real: Any) -> Any:
            def transform(*args: Any, **kwargs: Any) -> Any:
                through_openai["n"] += 1
                return real(*args, **kwargs)

            return transform

        monkeypatch.setattr(completions, "maybe_transform", counting(completions.maybe_transform))
        monkeypatch.setattr(responses, "maybe_transform", counting(responses.maybe_transform))
        before = sim.stats()["requests"]
        hit: Any = client.chat.completions.create(**ask)
        stream: Any = client.chat.completions.create(**ask, stream=True)
        chunks = list(stream)
        assert hit.route.cache_hit and stream.route.cache_hit
        assert hit.choices[0].message.content == live.choices[0].message.content
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            live.choices[0].message.content
        )
        if routed:
            whole: Any = client.responses.create(**asked)
            assert whole.route.cache_hit and whole.output_text == "".join(
                e.delta for e in live_events if e.type == "response.output_text.delta"
            )
        assert through_openai["n"] == 0
        assert sim.stats()["requests"] == before  # nothing went upstream
        misses = cache._misses
        fresh: Any = client.chat.completions.create(
            **{**ask, "messages": [{"role": "user", "content": "A new one, sync"}]}
        )
        assert fresh.route is None or not fresh.route.cache_hit  # a plain live answer: None
        assert through_openai["n"] == 1
        assert cache._misses == misses + 1  # looked up once, not again at the seam
        assert sim.stats()["requests"] == before + 1


def routed_client(sim: Simulator) -> llmroute.OpenAI:
    """A client with the route ``chat`` on ``sim`` and plain model names going to it too."""
    config = {
        "providers": {"a": {"base_url": sim.base_url, "api_key": KEY, "responses": True}},
        "models": {"chat": {"targets": ["a:sim-small"], "policy": "failover"}},
    }
    return sync_client(sim, config=config)


def sent_json(sim: Simulator, marker: str) -> dict[str, Any]:
    """The JSON body of the simulator's recorded request carrying ``marker``."""
    for request in reversed(sim.last_requests):
        body = request["json"]
        if isinstance(body, dict) and body.get("marker") == marker:
            return body
    raise AssertionError(f"no request with marker {marker}")


def test_streaming_response_of_a_routed_chat_reads_synchronously(sim: Simulator) -> None:
    """``with_streaming_response`` on a route is openai's sync ``APIResponse``, its body read
    from the client's loop, as for a plain model; a routed stream read raw is not asked for
    the usage chunk the engine would otherwise add."""
    with routed_client(sim) as client:
        lines: dict[str, list[str]] = {}
        for model in ("chat", "sim-small"):
            marker = f"lines-{model}-{os.getpid()}-{time.monotonic_ns()}"
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=MESSAGES, stream=True, extra_body={"marker": marker}
            ) as response:
                assert isinstance(response, openai.APIResponse)
                assert response.status_code == 200
                lines[model] = [line for line in response.iter_lines() if line]
            assert response.is_closed
            assert "stream_options" not in sent_json(sim, marker)
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=MESSAGES, stream=True
            ) as response:
                body = b"".join(response.iter_bytes())
            assert body.endswith(b"data: [DONE]\n\n")
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=MESSAGES, stream=True
            ) as response:
                stream = response.parse()
                assert isinstance(stream, Stream)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert len(text.split()) == 20
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=MESSAGES
            ) as response:
                assert isinstance(response, openai.APIResponse)
                assert response.parse().choices[0].message.content == text
                assert response.json()["object"] == "chat.completion"  # type: ignore[index]
        assert lines["chat"][-1] == lines["sim-small"][-1] == "data: [DONE]"
        assert all(line.startswith("data: {") for line in lines["chat"][:-1])
        marker = f"parsed-{os.getpid()}-{time.monotonic_ns()}"
        with client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_body={"marker": marker}
        ) as parsed:
            list(parsed)
        assert sent_json(sim, marker)["stream_options"] == {"include_usage": True}  # read parsed


def test_raw_response_of_a_routed_chat_reads_synchronously(sim: Simulator) -> None:
    """``with_raw_response`` on a route: openai's ``LegacyAPIResponse`` over a sync response,
    whose body reads as a plain model's does, streamed or not."""
    with routed_client(sim) as client:
        for model in ("chat", "sim-small"):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=MESSAGES, stream=True
            )
            assert isinstance(raw, openai._legacy_response.LegacyAPIResponse)
            assert raw.http_response.read().rstrip().endswith(b"data: [DONE]")
            assert raw.http_response.is_closed
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=MESSAGES, stream=True
            )
            with raw.parse() as stream:
                assert isinstance(stream, Stream)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert len(text.split()) == 20
            raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES)
            assert raw.status_code == 200
            assert raw.parse().choices[0].message.content == text
            assert b'"object": "chat.completion"' in raw.content
            raw.http_response.close()


def test_a_routed_streaming_response_left_early_resets_its_stream(sim_slow: Simulator) -> None:
    with routed_client(sim_slow) as client:
        settled_sync(sim_slow)  # an earlier test's reset lands before we count
        before = sim_slow.stats()["streams_cancelled"]
        with client.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES, stream=True
        ) as response:
            for _ in zip(range(3), response.iter_lines(), strict=False):
                pass
        with client.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES, stream=True
        ) as response:
            next(iter(response.parse()))
        deadline = time.monotonic() + 30  # a hang guard only
        while sim_slow.stats()["streams_cancelled"] < before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sim_slow.stats()["streams_cancelled"] == before + 2


def test_streaming_response_of_a_routed_responses_call_reads_synchronously(
    sim: Simulator,
) -> None:
    with routed_client(sim) as client:
        with client.responses.with_streaming_response.create(
            model="chat", input="Hello", stream=True
        ) as response:
            assert isinstance(response, openai.APIResponse)
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1].startswith('data: {"type":"response.completed"')
        with client.responses.with_streaming_response.create(model="chat", input="Hi") as response:
            assert response.parse().output_text
            assert response.json()["object"] == "response"  # type: ignore[index]
