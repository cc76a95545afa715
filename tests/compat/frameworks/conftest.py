"""Frameworks that take an openai client, run with llmroute's routed client.

Each module imports its framework with :func:`import_framework`, which skips the module when the
framework is missing: the frameworks do not install beside the newest openai (see
tests/compat/requirements-*.txt), so ``make test-frameworks`` runs this folder in environments of
its own, and the main environment skips it.

The ``served`` fixture runs each test three times: ``openai`` is openai's own client on one
simulator (it proves the framework, the simulator and the test agree); ``llmroute`` is
llmroute's client with a route (``chat``) whose targets are two simulators; ``llmroute-failover``
is the same route with a first target that answers every request with a 500, so each framework
call is served by the second after a failover. All see the same replies (the simulators answer
by the target's model name and the input), and each test checks what arrived at the targets:
the target's model name (``sim-small``), never the route's.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import httpx
import openai
import pytest

import llmroute
from llmroute.testing import Profile, Simulator

from ...conftest import KEY

TARGET_MODEL = "sim-small"
ROUTE = "chat"
VERSIONED = (
    "openai",
    "httpx",
    "httpx2",
    "instructor",
    "pydantic-ai-slim",
    "openai-agents",
    "langchain-openai",
    "langchain-core",
    "llama-index-llms-openai",
    "llama-index-core",
)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> str:
    """The installed versions of openai, its HTTP library and the frameworks, on one line."""
    return ", ".join(f"{d} {v}" for d in VERSIONED if (v := version(d)) is not None)


def import_framework(module: str, dist: str) -> Any:
    """Import a framework's module, or skip the test module if the framework is not installed.
    A framework named in ``LLMROUTE_TEST_FRAMEWORKS`` (the Makefile sets it for each
    environment) must import: there a failing import is an error, never a silent skip."""
    if dist in os.environ.get("LLMROUTE_TEST_FRAMEWORKS", "").split():
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"{dist} is not installed here (make test-frameworks runs it)"
    )


FRAMEWORKS = VERSIONED[3:]


def pytest_report_header() -> str | None:
    if not any(version(d) for d in FRAMEWORKS):
        return None
    return f"frameworks' environment: {versions()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if any(version(d) for d in FRAMEWORKS):  # the versions the framework checks ran against
        terminalreporter.write_line(f"frameworks' environment: {versions()}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the frameworks run on asyncio only


@pytest.fixture(scope="session")
def sims() -> Iterator[tuple[Simulator, Simulator]]:
    """Two TLS + HTTP/2 simulators: the targets of the route."""
    profile = Profile(reply_tokens=12)
    with Simulator(profile=profile, tls=True) as a, Simulator(profile=profile, tls=True) as b:
        yield a, b


@dataclass
class Served:
    """What the client under test is and what the simulators saw of it."""

    kind: str
    client: Any
    model: str
    """The model name the application passes to the framework."""
    sims: tuple[Simulator, ...]
    sync_client: Any
    """The sync client of the same kind (openai.OpenAI or llmroute.OpenAI), same targets."""
    target_model: str
    """The model name the targets are asked for."""
    failing: Simulator | None = None
    """The first target of the failover route, which answers every request with a 500."""

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """The requests the answering simulators recorded since the test began (optionally
        one path), in the order they arrived: a route may send one call to either target."""
        seen = sorted(
            (r for sim in self.sims for r in sim.last_requests), key=itemgetter("received")
        )
        return [r for r in seen if path is None or r["path"] == path]

    def assert_served(self, path: str, at_least: int = 1) -> list[dict[str, Any]]:
        """At least ``at_least`` requests to ``path`` reached the targets, each naming the
        target's model (the route was resolved), none the route itself."""
        seen = self.requests(path)
        assert len(seen) >= at_least, (path, [r["path"] for r in self.requests()])
        models = {(r["json"] or {}).get("model") for r in seen}
        assert models == {self.target_model}, models
        if self.failing is not None:  # it was tried first, and failed every time
            refused = [r for r in self.failing.last_requests if r["path"] == path]
            assert refused, "the failing target was never tried"
            assert self.failing.stats()["faults"].get("500", 0) >= len(refused)
        return seen

    def the_requests(self, path: str, at_least: int = 1) -> list[dict[str, Any]]:
        """The distinct requests to ``path``, in order (each checked by :meth:`assert_served`).

        A fresh client's route may send a request to a second, cold target beside its first
        choice (a probe: the same request, to learn that target's latency), so the targets can
        see a request twice; the framework sent it once."""
        seen: dict[str, dict[str, Any]] = {}
        for request in self.assert_served(path, at_least):
            seen.setdefault(json.dumps(request["json"], sort_keys=True), request)
        return list(seen.values())

    def the_request(self, path: str) -> dict[str, Any]:
        """The one request the framework sent to ``path`` (a probe's copy allowed, see
        :meth:`the_requests`)."""
        (request,) = self.the_requests(path)
        return request

    def replay(self, request: dict[str, Any]) -> Any:
        """What a target answers to a recorded request, asked again directly and unstreamed
        (the simulators' replies depend only on the model name and the input)."""
        body = {k: v for k, v in request["json"].items() if k not in ("stream", "stream_options")}
        sim = self.sims[0]
        origin = sim.base_url.removesuffix("/v1")
        with httpx.Client(verify=sim.ssl_context()) as http:
            answer = http.post(
                origin + request["path"], json=body, headers={"authorization": f"Bearer {KEY}"}
            )
        answer.raise_for_status()
        return answer.json()


def _route_config(
    sims: tuple[Simulator, Simulator], route: str, model: str, failing: bool
) -> dict[str, Any]:
    """Route ``route`` to ``model`` on both simulators; with ``failing``, the first target
    answers every request with a 500 (a header the simulator obeys) and the route fails over."""
    a, b = sims
    # The simulators serve the Responses API and keep the responses they issued.
    serves = {"api_key": KEY, "responses": True, "responses_stored": True}
    first: dict[str, Any] = {"base_url": a.base_url, **serves}
    policy: dict[str, Any] = {}
    if failing:
        first["headers"] = {"x-sim-fault": "500"}
        policy = {"policy": "failover"}
    return {
        "providers": {"sim_a": first, "sim_b": {"base_url": b.base_url, **serves}},
        "models": {route: {"targets": [f"sim_a:{model}", f"sim_b:{model}"], **policy}},
    }


def _routed_clients(
    sims: tuple[Simulator, Simulator], route: str, model: str, failing: bool
) -> tuple[Any, Any]:
    config, ctx = _route_config(sims, route, model, failing), sims[0].ssl_context()
    return (
        llmroute.AsyncOpenAI(api_key=KEY, config=config, verify=ctx, max_retries=0),
        llmroute.OpenAI(api_key=KEY, config=config, verify=ctx, max_retries=0),
    )


def _openai_clients(sim: Simulator) -> tuple[Any, Any]:
    ctx = sim.ssl_context()
    return (
        openai.AsyncOpenAI(
            api_key=KEY,
            base_url=sim.base_url,
            http_client=openai.DefaultAsyncHttpxClient(verify=ctx),
            max_retries=0,
        ),
        openai.OpenAI(
            api_key=KEY,
            base_url=sim.base_url,
            http_client=openai.DefaultHttpxClient(verify=ctx),
            max_retries=0,
        ),
    )


@pytest.fixture(params=["openai", "llmroute", "llmroute-failover"])
async def served(
    request: pytest.FixtureRequest,
    sims: tuple[Simulator, Simulator],
    record_property: Any,
) -> AsyncIterator[Served]:
    """The client under test (see the module docstring), with the simulators' records reset.
    A test module may name its own ``ROUTE`` and ``TARGET_MODEL``."""
    route = getattr(request.module, "ROUTE", ROUTE)
    model = getattr(request.module, "TARGET_MODEL", TARGET_MODEL)
    for sim in sims:
        sim.reset_stats()
    record_property("versions", versions())
    print(versions())
    kind = request.param
    if kind == "openai":
        client, sync_client = _openai_clients(sims[0])
        result = Served(kind, client, model, sims[:1], sync_client, model)
    else:
        failing = kind == "llmroute-failover"
        client, sync_client = _routed_clients(sims, route, model, failing)
        healthy = sims[1:] if failing else sims
        result = Served(
            kind, client, route, healthy, sync_client, model, sims[0] if failing else None
        )
    try:
        async with client:
            yield result
    finally:
        sync_client.close()


def assert_openai_client(served: Served) -> None:
    """The clients are openai's classes (llmroute's are subclasses): frameworks check it."""
    assert isinstance(served.client, openai.AsyncOpenAI), type(served.client).__mro__
    assert isinstance(served.sync_client, openai.OpenAI), type(served.sync_client).__mro__
