"""Budgets in money (``budget_usd``): admitted on the most a request may cost at the dearest
target of its model name, settled on what it cost at the target that answered, counted in
nano-dollars in one real redis-server shared by two gateway replicas.

Every target here is a simulator priced in the config: ``cheap`` (and ``slow``, ``held``) at
$1 / $2 a million input / output tokens (1,000 and 2,000 nano-dollars a token), ``dear`` at
$3 / $6. Route ``chat`` fails over from ``cheap`` to ``dear``, so its answers come from
``cheap`` while its estimate is at ``dear``'s prices. Every cost the key pays is then 1,000
nano-dollars a prompt token and 2,000 an answer token, exactly.

Assertions are on counts and statuses, never on time; every wait is bounded in count.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal
from typing import Any

import anyio
import httpx
import pytest

from llmroute import ConfigError
from llmroute.cli import main
from llmroute.routing.stats import estimate_prompt_tokens
from llmroute.server import Gateway, GatewayApp
from llmroute.server._tenants import usd
from llmroute.testing import Profile, Simulator

KEYS = {"payer": "gw-money-payer-0123456789", "admin": "gw-money-admin-0123456789"}
ENVIRON = {f"GM_{name.upper()}": key for name, key in KEYS.items()}
MESSAGES = [{"role": "user", "content": "Tell me about money."}]
DEADLINE = 30.0  # an HTTP client's timeout: a hang guard only
TRIES = 200
PAUSE = 0.05
REPLY = 20
LONG = 1000
CUT = 5  # tokens cutter streams before its stream breaks
CHEAP = {"input": 1, "output": 2}  # USD per million tokens
DEAR = {"input": 3, "output": 6}
BUDGET = 2_200_000  # nano-dollars: $0.0022
PERIOD = "8760h"  # no period ends during a test


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Simulator]]:
    profiles = {
        "cheap": Profile(reply_tokens=REPLY),
        "dear": Profile(reply_tokens=REPLY),
        "slow": Profile(reply_tokens=LONG, inter_token=0.01),
        "held": Profile(reply_tokens=REPLY, hold_first_token=True, hang_max=60),
        "late": Profile(reply_tokens=REPLY, ttft_median=5.0),
    }
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(Simulator(profile=profile, tls=False))
            for name, profile in profiles.items()
        }


def config_for(sims: dict[str, Simulator], tenants: dict[str, Any], redis: str) -> dict[str, Any]:
    providers = {
        name: {
            "base_url": sim.base_url,
            "api_key": "sk-money-upstream",
            "prices": {"*": DEAR if name in ("dear", "late") else CHEAP},
            "responses": True,
        }
        for name, sim in sims.items()
    }
    # cutter's streams break after CUT tokens (at dear's price); mender continues them.
    cutter = {**providers["dear"], "headers": {"x-sim-fault": f"drop:{CUT}"}}
    providers |= {"cutter": cutter, "mender": {**providers["cheap"], "continuation": {}}}
    return {
        "providers": providers,
        "models": {
            "chat": {"targets": ["cheap:sim-small", "dear:sim-small"], "policy": "failover"},
            # Not continued (a continuation's bound would be counted in its estimate).
            "slow": {"targets": ["slow:sim-small"], "continue_on_break": False},
            "held": {"targets": ["held:sim-small"], "continue_on_break": False},
            # Both started at once: cheap answers, late (priced as dear) is cancelled.
            "raced": {
                "targets": ["cheap:sim-small", "late:sim-small"],
                "policy": "race",
                "continue_on_break": False,
            },
            "mended": {"targets": ["cutter:sim-small", "mender:sim-small"], "policy": "failover"},
        },
        "routing": {"explore": 0},
        "redis": {"url": redis, "prefix": f"money-{uuid.uuid4().hex[:8]}"},
        "gateway": {
            "keys": {name: f"GM_{name.upper()}" for name in KEYS},
            "tenants": {"admin": {"admin": True}, **tenants},
            "limits_backend": "redis",
        },
    }


@pytest.fixture
def two_replicas(redis_url: str, sims: dict[str, Simulator]) -> Iterator[tuple[Gateway, Gateway]]:
    yield from replicas(redis_url, sims, BUDGET)


@pytest.fixture
def rich_replicas(redis_url: str, sims: dict[str, Simulator]) -> Iterator[tuple[Gateway, Gateway]]:
    """Two replicas under a budget of ten times BUDGET (a continued stream's estimate)."""
    yield from replicas(redis_url, sims, 10 * BUDGET)


def replicas(
    redis_url: str, sims: dict[str, Simulator], nanos: int
) -> Iterator[tuple[Gateway, Gateway]]:
    budget = {"budget_usd": f"{nanos / 10**9:.9f}", "budget_period": PERIOD}
    config = config_for(sims, {"payer": budget}, redis_url)
    with ExitStack() as stack:
        first = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        second = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        yield first, second


def root(gateway: Gateway) -> str:
    return gateway.base_url.removesuffix("/v1")


def post(gateway: Gateway, body: dict[str, Any], path: str = "chat/completions") -> httpx.Response:
    with httpx.Client(timeout=DEADLINE) as client:
        return client.post(
            root(gateway) + f"/v1/{path}",
            json=body,
            headers={"authorization": f"Bearer {KEYS['payer']}"},
        )


def usage(gateway: Gateway, scope: str = "fleet") -> dict[str, Any]:
    answer = httpx.get(
        root(gateway) + f"/admin/usage?scope={scope}",
        headers={"authorization": f"Bearer {KEYS['admin']}"},
        timeout=DEADLINE,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["keys"]["payer"]


def spent(gateway: Gateway) -> int:
    """The key's money budget spent now (nano-dollars), as ``GET /admin/usage`` says."""
    return int(usage(gateway)["limits"]["budget_spent_nanos"])


def priced(figures: dict[str, Any]) -> int:
    """What the usage ``figures`` cost at ``cheap``'s prices (every answer's target here)."""
    return 1000 * figures["prompt_tokens"] + 2000 * figures["completion_tokens"]


def remaining(answer: httpx.Response) -> int:
    return round(float(answer.headers["x-llmroute-budget-remaining-usd"]) * 10**9)


def wait_for(check: Callable[[], bool], what: str) -> None:
    for _ in range(TRIES):
        if check():
            return
        time.sleep(PAUSE)
    raise AssertionError(f"{what}: not seen in {TRIES} polls")


def streamed_usage(answer: httpx.Response) -> dict[str, Any]:
    """A stream's last ``usage``."""
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line[6:7] == "{"]
    return [e["usage"] for e in events if e.get("usage")][-1]


def sent_size(body: dict[str, Any]) -> int:
    """The bytes ``body`` is posted as (httpx's ``json=``: compact JSON, UTF-8): a money
    budget's estimate counts a prompt token a byte of the body as the gateway received it."""
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


def dearest(body: dict[str, Any]) -> int:
    """The estimate the gateway admits ``body`` on: a token a byte of its JSON as sent and its
    ``max_tokens``, at ``dear``'s prices (the dearer target of ``chat``)."""
    size = sent_size(body)
    return 3000 * size + 6000 * body["max_tokens"]


def test_a_money_budget_is_spent_to_its_limit_and_no_further(
    two_replicas: tuple[Gateway, Gateway],
    sims: dict[str, Simulator],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stream its client cuts after five tokens is charged its prompt and what was sent;
    then whole answers, alternating replicas, each admitted on its dearest cost and charged
    its real one, until the next one's dearest cost does not fit in what is left: refused
    (429 ``insufficient_quota``), with the budget spent to the nano-dollar as the answers'
    usage says, and never past it."""
    first, second = two_replicas
    cancelled = sims["slow"].stats()["streams_cancelled"]
    body = {"model": "slow", "messages": MESSAGES, "stream": True, "max_tokens": LONG}
    read = 0
    with (
        httpx.Client(timeout=DEADLINE) as client,
        client.stream(
            "POST",
            first.base_url + "/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {KEYS['payer']}"},
        ) as reply,
    ):
        assert reply.status_code == 200
        assert reply.headers["x-llmroute-budget-limit-usd"] == "0.0022"
        held = BUDGET - remaining(reply)  # the stream's estimate: nothing else was counted
        size = sent_size(body)
        assert held == 1000 * size + 2000 * LONG  # slow's own price: its only target
        for line in reply.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                "content"
            ):
                read += 1
                if read == 5:
                    break  # the client leaves
    wait_for(lambda: spent(second) < held, "the cut stream settled")
    wait_for(lambda: sims["slow"].stats()["streams_cancelled"] == cancelled + 1, "cancelled")
    figures = usage(second)
    assert figures["completion_tokens"] >= read
    assert spent(second) == priced(figures) == figures["spend_nanos"]
    assert spent(second) < 1000 * size + 2000 * LONG // 2  # far below its estimate

    used = spent(second)
    chat = {"model": "chat", "messages": MESSAGES, "max_tokens": 250}
    estimate = dearest(chat)
    admitted = 0
    for i in range(40):  # bounded: the budget is met within about ten requests
        replica, other = (first, second) if i % 2 == 0 else (second, first)
        answer = post(replica, chat)
        if answer.status_code == 429:
            break
        assert answer.status_code == 200, answer.text
        # Admitted with its dearest cost counted beside the real cost of those before it.
        assert remaining(answer) == BUDGET - used - estimate
        cost = 1000 * answer.json()["usage"]["prompt_tokens"] + 2000 * REPLY
        assert cost < estimate
        used += cost
        admitted += 1
        wait_for(lambda other=other, want=used: spent(other) == want, f"spent {used}")
    else:
        raise AssertionError("no request was refused")
    error = answer.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert answer.headers["x-should-retry"] == "false"
    assert "may cost up to $" in error["message"]
    # Refused exactly when its dearest cost does not fit, the budget spent to what the answers
    # cost and no further, on both replicas' figures.
    assert used + estimate > BUDGET >= used
    assert admitted >= 3
    for replica in two_replicas:
        fleet = usage(replica)
        assert fleet["limits"]["budget_spent_nanos"] == used == fleet["spend_nanos"]
        assert fleet["limits"]["budget_spent_usd"] == fleet["spend_usd"]
        assert priced(fleet) == used
        # By target: the stream's at slow, the answers' at cheap (never at dear, the estimate's).
        by_target = fleet["spend_by_target"]
        assert set(by_target) == {"slow:sim-small", "cheap:sim-small"}
        assert sum(Decimal(v) for v in by_target.values()) * 10**9 == used
    mine = [usage(replica, "replica")["spend_nanos"] for replica in two_replicas]
    assert sum(mine) == used
    assert sum(spend_metric(replica) for replica in two_replicas) == pytest.approx(used / 10**9)
    # llmroute top shows a replica's spend per key.
    assert main(["top", "--once", "--key", KEYS["admin"], root(first)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("payer ")]
    assert rows[0].split()[-1] == f"${spend_metric(first):.4g}"


def test_a_racing_route_spends_its_budget_to_the_limit_hedges_counted(
    two_replicas: tuple[Gateway, Gateway],
    sims: dict[str, Simulator],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every request of a route that races two targets is admitted on both attempts' dearest
    cost and charged its answer and the cancelled attempt (its prompt, at late's price), on
    alternating replicas, until the next estimate does not fit: the budget spent to the
    nano-dollar and no further, the racing's part counted as the key's ``hedge_nanos`` and
    shown as its share in ``/admin/usage`` and ``llmroute top``."""
    first, second = two_replicas
    raced = {"model": "raced", "messages": MESSAGES, "max_tokens": 100}
    estimate = 2 * dearest(raced)  # two attempts, each at most at dear's prices
    used = admitted = 0
    for i in range(40):  # bounded: the budget is met within a few requests
        replica, other = (first, second) if i % 2 == 0 else (second, first)
        answer = post(replica, raced)
        if answer.status_code == 429:
            break
        assert answer.status_code == 200, answer.text
        assert remaining(answer) == BUDGET - used - estimate
        wait_for(lambda other=other, was=used: spent(other) > was, "the request charged")
        cost = spent(other) - used
        tokens = answer.json()["usage"]
        answered = 1000 * tokens["prompt_tokens"] + 2000 * tokens["completion_tokens"]
        assert cost > answered  # the cancelled attempt's prompt too
        assert (cost - answered) % 3000 == 0  # at late's input price
        assert cost <= estimate
        used += cost
        admitted += 1
    else:
        raise AssertionError("no request was refused")
    assert answer.json()["error"]["code"] == "insufficient_quota"
    assert used + estimate > BUDGET >= used
    assert admitted >= 2
    for replica in two_replicas:
        fleet = usage(replica)
        assert fleet["limits"]["budget_spent_nanos"] == used == fleet["spend_nanos"]
        assert 0 < fleet["hedge_nanos"] == used - priced(fleet)
        assert fleet["hedge_nanos"] % (3000 * admitted) == 0  # the same prompt each time
        assert Decimal(fleet["hedge_usd"]) * 10**9 == fleet["hedge_nanos"]
        assert fleet["hedge_share"] == round(fleet["hedge_nanos"] / used, 4)
        # Each attempt filed under the target that billed it: the answers at cheap, the
        # cancelled racers at late; together the key's spend, to the nano-dollar.
        assert fleet["spend_by_target"] == {
            "cheap:sim-small": usd(priced(fleet)),
            "late:sim-small": usd(fleet["hedge_nanos"]),
        }
    assert sum(spend_metric(replica, "late:sim-small") for replica in two_replicas) == (
        pytest.approx(fleet["hedge_nanos"] / 10**9)
    )
    mine = usage(first, "replica")
    assert main(["top", "--once", "--key", KEYS["admin"], root(first)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-2:] for line in lines if line.startswith("key ")] == [["hedged", "spend"]]
    row = next(line for line in lines if line.startswith("payer "))
    assert row.split()[-2] == f"{mine['hedge_nanos'] / mine['spend_nanos'] * 100:.0f}%"


def test_a_raced_stream_its_client_cuts_is_charged_what_was_sent_and_the_racer(
    two_replicas: tuple[Gateway, Gateway],
) -> None:
    """A stream of the racing route, cut by its client after its first token: charged the
    prompt and what was delivered at cheap's price, and the cancelled racer's prompt at
    late's, counted as its ``hedge_nanos``; within its estimate, on both replicas."""
    first, second = two_replicas
    body = {"model": "raced", "messages": MESSAGES, "stream": True, "max_tokens": 100}
    with (
        httpx.Client(timeout=DEADLINE) as client,
        client.stream(
            "POST",
            first.base_url + "/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {KEYS['payer']}"},
        ) as reply,
    ):
        assert reply.status_code == 200
        held = BUDGET - remaining(reply)
        assert held == 2 * dearest(body)  # both racers at dear's prices, not continued
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                break  # the client leaves at its first event
    wait_for(lambda: 0 < spent(second) < held, "the cut stream settled")
    for replica in two_replicas:
        fleet = usage(replica)
        assert fleet["limits"]["budget_spent_nanos"] == fleet["spend_nanos"]
        assert fleet["spend_nanos"] == priced(fleet) + fleet["hedge_nanos"]
        assert fleet["hedge_nanos"] > 0 and fleet["hedge_nanos"] % 3000 == 0


def test_a_continued_stream_is_charged_each_target_its_own_part_once(
    rich_replicas: tuple[Gateway, Gateway],
) -> None:
    """A stream broken after CUT tokens and continued on another target is charged what each
    vendor billed, once: the broken attempt its prompt and the CUT tokens it streamed (at
    dear's price), the continuation its own prompt (the answer so far included) and the rest
    of the answer (at cheap's), never the whole answer at the first target's price as well."""
    first, second = rich_replicas
    body = {
        "model": "mended",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 100,
        "stream_options": {"include_usage": True},
    }
    answer = post(first, body)
    assert answer.status_code == 200, answer.text
    text = "".join(
        chunk["choices"][0]["delta"].get("content") or ""
        for line in answer.text.splitlines()
        if line[6:7] == "{" and (chunk := json.loads(line[6:]))["choices"]
    )
    assert len(text.split()) == REPLY  # the whole answer, continued
    combined = streamed_usage(answer)
    assert combined["completion_tokens"] == REPLY  # the caller's usage: the whole answer
    # What each vendor billed: cutter its prompt (llmroute's count: it sent no usage) and the
    # tokens it streamed; mender its prompt (the answer so far in it) and the rest.
    cut = 3000 * estimate_prompt_tokens(MESSAGES) + 6000 * CUT
    mended = 1000 * combined["prompt_tokens"] + 2000 * (REPLY - CUT)
    wait_for(lambda: spent(second) > 0, "the continued stream charged")
    for replica in rich_replicas:
        fleet = usage(replica)
        assert fleet["limits"]["budget_spent_nanos"] == fleet["spend_nanos"] == cut + mended
        assert fleet["hedge_nanos"] == mended  # the continuation's part
        assert fleet["spend_by_target"] == {
            "cutter:sim-small": usd(cut),
            "mender:sim-small": usd(mended),
        }


def test_every_api_on_a_route_is_charged_its_vendors_usage(
    rich_replicas: tuple[Gateway, Gateway],
) -> None:
    """A Responses API call, a legacy completion and an embedding on route ``chat`` are each
    charged the usage their vendor sent, at cheap's price (the target that answered), to the
    nano-dollar; an embedding, which has no answer, is admitted without a max_tokens."""
    first, second = rich_replicas
    text = "Tell me about money, briefly."
    calls = [
        ("responses", {"input": text, "max_output_tokens": 50}, "input_tokens", "output_tokens"),
        ("completions", {"prompt": text, "max_tokens": 50}, "prompt_tokens", "completion_tokens"),
        ("embeddings", {"input": text}, "prompt_tokens", "completion_tokens"),
    ]
    used = 0
    for i, (path, body, prompt, completion) in enumerate(calls):
        answer = post((first, second)[i % 2], {"model": "chat", **body}, path)
        assert answer.status_code == 200, answer.text
        tokens = answer.json()["usage"]
        used += 1000 * tokens[prompt] + 2000 * tokens.get(completion, 0)
        wait_for(lambda want=used: spent(second) == want, f"{path} charged its usage")
    for replica in rich_replicas:
        fleet = usage(replica)
        assert fleet["spend_nanos"] == fleet["limits"]["budget_spent_nanos"] == used
        assert fleet["spend_by_target"] == {"cheap:sim-small": usd(used)}


def spend_metric(gateway: Gateway, target: str = "") -> float:
    """The replica's ``llmroute_gateway_spend_usd_total`` of key ``payer``, over targets (or
    at ``target``)."""
    text = httpx.get(
        root(gateway) + "/metrics",
        headers={"authorization": f"Bearer {KEYS['admin']}"},
        timeout=DEADLINE,
    ).text
    lines = [
        line for line in text.splitlines() if line.startswith("llmroute_gateway_spend_usd_total{")
    ]
    mine = [line for line in lines if 'key="payer"' in line and f'target="{target}' in line]
    return sum(float(line.rpartition(" ")[2]) for line in mine)


def test_concurrent_requests_on_two_replicas_take_no_more_than_the_budget(
    redis_url: str, sims: dict[str, Simulator]
) -> None:
    """Eight requests at once, four on each replica, each held before its first token: the
    budget holds three dearest costs and a half, so exactly three are admitted (the admission
    script is atomic across replicas), and once they answer their real costs are counted."""
    held = {
        "model": "held",
        "messages": MESSAGES,
        "max_tokens": 50,
        "stream": True,  # held before its first token (a whole answer is not)
        "stream_options": {"include_usage": True},
    }
    size = sent_size(held)
    estimate = 1000 * size + 2000 * 50
    budget = estimate * 7 // 2
    tenants = {"payer": {"budget_usd": f"{budget / 10**9:.9f}", "budget_period": PERIOD}}
    config = config_for(sims, tenants, redis_url)
    sim = sims["held"]
    with (
        Gateway(config, environ=ENVIRON, max_retries=0) as first,
        Gateway(config, environ=ENVIRON, max_retries=0) as second,
        ThreadPoolExecutor(8) as pool,
    ):
        before = sim.stats()["requests"]
        futures = [pool.submit(post, (first, second)[i % 2], held) for i in range(8)]
        wait_for(lambda: sum(f.done() for f in futures) == 5, "five refused")
        refused = [f.result() for f in futures if f.done()]
        assert [r.status_code for r in refused] == [429] * 5
        wait_for(lambda: sim.stats()["requests"] - before == 3, "three sent upstream")
        sim.release()
        answers = [f.result() for f in futures if f.result().status_code == 200]
        assert len(answers) == 3
        cost = sum(1000 * streamed_usage(a)["prompt_tokens"] + 2000 * REPLY for a in answers)
        wait_for(lambda: spent(second) == cost, "the real costs counted")
        assert spent(first) == cost <= budget


def test_a_streams_estimate_reserves_the_routes_own_continuations(
    redis_url: str, sims: dict[str, Simulator]
) -> None:
    """A stream is admitted on its route's own ``max_continuations``, not the default three:
    on a route that continues nothing, its one attempt (admitted where three continuations
    would not fit); on one that may continue six times, all six (refused where three would
    fit, which would let its spend pass the budget)."""
    routes = {"none": 0, "six": 6}
    bodies = {
        name: {"model": name, "messages": MESSAGES, "stream": True, "max_tokens": 100}
        for name in routes
    }
    single, continued = {}, {}
    for name, body in bodies.items():  # at cheap's price, the routes' only target
        size = sent_size(body)
        single[name] = 1000 * size + 2000 * 100
        continued[name] = 1000 * (size + 100) + 2000 * 100
    # Room for the first attempt and four continuations of either route.
    budget = max(single.values()) + 4 * max(continued.values())
    tenants = {"payer": {"budget_usd": f"{budget / 10**9:.9f}", "budget_period": PERIOD}}
    config = config_for(sims, tenants, redis_url)
    for name, count in routes.items():
        config["models"][name] = {"targets": ["cheap:sim-small"], "max_continuations": count}
    with Gateway(config, environ=ENVIRON, max_retries=0) as gateway:
        six = post(gateway, bodies["six"])
        assert single["six"] + 3 * continued["six"] <= budget  # three would have fitted
        assert six.status_code == 429, six.text
        assert six.json()["error"]["code"] == "insufficient_quota"
        with (
            httpx.Client(timeout=DEADLINE) as client,
            client.stream(
                "POST",
                gateway.base_url + "/chat/completions",
                json=bodies["none"],
                headers={"authorization": f"Bearer {KEYS['payer']}"},
            ) as reply,
        ):
            assert reply.status_code == 200
            assert budget - remaining(reply) == single["none"]  # no continuation reserved
            reply.read()


CACHED = {"input": 1, "cached_input": 0.25, "cache_write": 1.25, "cache_write_1h": 2, "output": 2}
"""USD per million tokens: 1,000 nano-dollars a fresh prompt token, 250 a cache read, 2,000 a
1-hour cache write, 2,000 an answer token."""


def cached_tokens(usage: dict[str, Any]) -> int:
    """The prompt tokens read from the vendor's cache, as the caller's usage says (OpenAI's
    field, or DeepSeek's)."""
    if "prompt_cache_hit_tokens" in usage:
        return int(usage["prompt_cache_hit_tokens"])
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_a_cached_prompt_is_charged_at_the_cached_price(redis_url: str) -> None:
    """The vendor's prompt cache, in each family's usage (OpenAI's
    ``prompt_tokens_details.cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``,
    Anthropic's cache writes and reads): a request is charged its cache reads at the cached
    price and its writes at theirs, as ``route.cost`` prices them and the vendor bills, not
    its whole prompt as fresh input. The first request writes the system prompt, the second
    (streamed) reads it; a model of ``default_provider`` (not a route) likewise."""
    profiles = {
        "oa": Profile(reply_tokens=REPLY, prompt_cache="openai"),
        "ds": Profile(reply_tokens=REPLY, prompt_cache="deepseek"),
        "an": Profile(reply_tokens=REPLY),  # Anthropic's cache: the request's cache_control
    }
    kinds = {"ds": {"kind": "deepseek"}, "an": {"kind": "anthropic"}}
    system = f"You answer in one short paragraph, always, as house {uuid.uuid4().hex} says."
    block = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    tenants = {"payer": {"budget_usd": 1, "budget_period": PERIOD}}
    with ExitStack() as stack:
        sims = {
            name: stack.enter_context(Simulator(profile=profile, tls=False))
            for name, profile in profiles.items()
        }
        config = {
            "routing": {"explore": 0},
            "redis": {"url": redis_url, "prefix": f"money-{uuid.uuid4().hex[:8]}"},
            "gateway": {
                "keys": {name: f"GM_{name.upper()}" for name in KEYS},
                "tenants": {"admin": {"admin": True}, **tenants},
                "limits_backend": "redis",
            },
            "providers": {
                name: {
                    "base_url": sim.base_url,
                    "api_key": "sk-money-upstream",
                    "prices": {"*": CACHED},
                    **kinds.get(name, {}),
                }
                for name, sim in sims.items()
            },
            "models": {
                name: {"targets": [f"{name}:sim-small"], "continue_on_break": False}
                for name in sims
            },
            "default_provider": "oa",
        }
        gateway = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        # Admitted on the prompt as 1-hour cache writes, the dearest class it may be billed as.
        body = {"model": "an", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50}
        size = len(json.dumps(body, ensure_ascii=False).encode())
        assert gateway.app.prices.estimate("an", body, "chat") == 2000 * size + 2000 * 50
        used = 0
        for name in sims:
            head = {"role": "system", "content": block if name == "an" else system}
            seen: list[tuple[dict[str, Any], int]] = []
            for question, stream in (("What is a cache?", False), ("What does it save?", True)):
                body: dict[str, Any] = {
                    "model": name,
                    "messages": [head, {"role": "user", "content": question}],
                    "max_tokens": 50,
                }
                if stream:
                    body |= {"stream": True, "stream_options": {"include_usage": True}}
                answer = post(gateway, body)
                assert answer.status_code == 200, answer.text
                tokens = streamed_usage(answer) if stream else answer.json()["usage"]
                wait_for(lambda was=used: spent(gateway) > was, f"{name} charged")
                seen.append((tokens, spent(gateway) - used))
                used = spent(gateway)
            (first, wrote_it), (second, read_it) = seen
            read = cached_tokens(second)
            assert cached_tokens(first) == 0 and read > 0
            assert first["completion_tokens"] == second["completion_tokens"] == REPLY
            # The second read what the first wrote (Anthropic's, at the 1-hour write price).
            written = read if name == "an" else 0
            fresh = first["prompt_tokens"] - written
            assert wrote_it == 1000 * fresh + 2000 * written + 2000 * REPLY, name
            fresh = second["prompt_tokens"] - read
            assert read_it == 1000 * fresh + 250 * read + 2000 * REPLY, name
        # A model of default_provider (no route, no route report): the vendor's usage too.
        alone = f"Answer as house {uuid.uuid4().hex} says, in a word."
        for question, read_before in (("What is a cache?", False), ("What does it save?", True)):
            messages = [{"role": "system", "content": alone}, {"role": "user", "content": question}]
            answer = post(gateway, {"model": "sim-small", "messages": messages, "max_tokens": 50})
            assert answer.status_code == 200, answer.text
            tokens = answer.json()["usage"]
            read = cached_tokens(tokens)
            assert (read > 0) is read_before
            wait_for(lambda was=used: spent(gateway) > was, "default_provider's answer charged")
            fresh = tokens["prompt_tokens"] - read
            assert spent(gateway) - used == 1000 * fresh + 250 * read + 2000 * REPLY
            used = spent(gateway)
        fleet = usage(gateway)
        assert fleet["spend_nanos"] == fleet["limits"]["budget_spent_nanos"] == used


@pytest.mark.parametrize(
    ("prices", "said"),
    [
        ({}, "no price is known for target 'dear:sim-small'"),
        ({"*": {**DEAR, "currency": "CNY"}}, "'dear:sim-small' is priced in CNY"),
    ],
)
def test_a_money_budget_over_a_target_without_a_usd_price_is_a_config_error(
    sims: dict[str, Simulator], redis_url: str, prices: dict[str, Any], said: str
) -> None:
    """Never free: a key with ``budget_usd`` that may use a target without a price in USD
    is refused at start, the message naming the field, the key, the target and the model."""
    tenants = {"payer": {"budget_usd": 1, "budget_period": "day"}}
    config = config_for(sims, tenants, redis_url)
    config["providers"]["dear"]["prices"] = prices
    with pytest.raises(ConfigError) as raised:
        GatewayApp(config, environ=ENVIRON)
    message = str(raised.value)
    assert "budget_usd of key 'payer'" in message
    assert said in message
    assert "model 'chat'" in message
    # Limited to the models whose targets are priced, the key is accepted.
    config["gateway"]["tenants"]["payer"]["models"] = ["slow", "held"]
    GatewayApp(config, environ=ENVIRON)


def test_budget_usd_needs_its_period() -> None:
    from llmroute.config import KeySettings, key_settings_problem

    problem = key_settings_problem(KeySettings(budget_usd="0.5"), [])
    assert problem is not None and problem[0] == "budget_period"
    assert "budget_usd needs a budget_period" in problem[1]


def test_a_team_made_over_the_admin_api_with_budget_usd_is_never_served_free(
    redis_url: str, sims: dict[str, Simulator]
) -> None:
    """A team with ``budget_usd`` made over the admin API (the start could not check it),
    its key's requests to a route with a priced target and an unpriced one: 400
    ``model_not_priced`` naming the target, nothing sent; to a priced route, served and
    counted. The team reads back with its budget as an exact decimal string, on either
    replica."""
    config = config_for(sims, {}, redis_url)
    config["providers"]["dear"]["prices"] = {}
    admin = {"authorization": f"Bearer {KEYS['admin']}"}
    with (
        Gateway(config, environ=ENVIRON, max_retries=0) as first,
        Gateway(config, environ=ENVIRON, max_retries=0) as second,
        httpx.Client(timeout=DEADLINE) as client,
    ):
        team = {"budget_usd": "0.01", "budget_period": PERIOD}
        made = client.put(root(first) + "/admin/teams/spenders", json=team, headers=admin)
        assert made.status_code in (200, 201), made.text
        key = client.post(
            root(first) + "/admin/keys", json={"name": "spender", "team": "spenders"}, headers=admin
        )
        assert key.status_code == 201, key.text
        secret = key.json()["key"]
        wait_for(
            lambda: (
                client.get(root(second) + "/admin/teams/spenders", headers=admin)
                .json()
                .get("limits", {})
                .get("budget_usd")
                == "0.01"
            ),
            "the team on the other replica",
        )
        shown = client.get(root(second) + "/admin/teams/spenders", headers=admin).json()
        assert shown["limits"]["budget_usd"] == "0.01"
        asked = {"model": "chat", "messages": MESSAGES, "max_tokens": 10}
        sent = sims["cheap"].stats()["requests"]

        def ask(replica: Gateway, body: dict[str, Any]) -> httpx.Response:
            return client.post(
                replica.base_url + "/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {secret}"},
            )

        wait_for(lambda: ask(second, asked).status_code == 400, "the key on the other replica")
        refused = ask(second, asked)
        error = refused.json()["error"]
        assert error["code"] == "model_not_priced"
        assert "Team 'spenders' (key 'spender') has a budget in USD" in error["message"]
        assert "no price is known for target 'dear:sim-small'" in error["message"]
        assert sims["cheap"].stats()["requests"] == sent
        served = ask(first, {**asked, "model": "slow", "max_tokens": 3})
        assert served.status_code == 200, served.text
        tokens = served.json()["usage"]
        cost = 1000 * tokens["prompt_tokens"] + 2000 * tokens["completion_tokens"]
        wait_for(
            lambda: (
                client.get(root(second) + "/admin/usage", headers=admin).json()["teams"][
                    "spenders"
                ]["limits"]["budget_spent_nanos"]
                == cost
            ),
            "the team's spend",
        )
        used = client.get(root(second) + "/admin/usage", headers=admin).json()
        assert used["teams"]["spenders"]["spend_nanos"] == cost


@pytest.mark.parametrize(
    ("route", "stream", "attempts"),
    [
        ({"policy": "failover"}, False, (1, 0)),
        ({"policy": "hedge"}, False, (2, 0)),  # 1 + max_hedges (explore is 0 here)
        ({"policy": "hedge", "max_hedges": 0}, False, (2, 0)),  # a latency goal's hedge
        ({"policy": "failover", "ttft_target": "1s"}, False, (1, 0)),
        ({"policy": "race"}, False, (2, 0)),
        ({"policy": "hedge"}, True, (2, 3)),  # a stream may be continued three times
        ({"policy": "hedge", "continue_on_break": False}, True, (2, 0)),
        ({"policy": "hedge", "max_continuations": 0}, True, (2, 0)),
        ({"policy": "hedge", "max_continuations": 6}, True, (2, 6)),
    ],
)
def test_the_estimate_counts_every_attempt_a_route_may_be_billed_for(
    sims: dict[str, Simulator],
    redis_url: str,
    route: dict[str, Any],
    stream: bool,
    attempts: tuple[int, int],
) -> None:
    """The admission's estimate: the dearest single attempt times the attempts the policy may
    start before a first token, and a stream's continuations, each re-sending the prompt and
    the whole answer."""
    config = config_for(sims, {}, redis_url)
    config["models"]["chat"] = {"targets": ["cheap:sim-small", "dear:sim-small"], **route}
    app = GatewayApp(config, environ=ENVIRON)
    anyio.run(app.aclose)  # its Redis connections (prices need none)
    prices = app.prices
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 100, "stream": stream}
    assert prices.attempts("chat", body, "chat") == attempts
    size = sent_size(body)  # the bytes the gateway received
    first, continuations = attempts
    continued = 3000 * (size + 100) + 6000 * 100
    assert (
        prices.estimate("chat", body, "chat", size)
        == first * dearest(body) + continuations * continued
    )
    # Without the bytes received (a caller of its own), its JSON encoded here, spaced.
    spaced = len(json.dumps(body, ensure_ascii=False).encode())
    assert spaced > size
    assert prices.estimate("chat", body, "chat") == prices.estimate("chat", body, "chat", spaced)


def estimated_metric(gateway: Gateway) -> float:
    """The replica's ``llmroute_gateway_estimated_spend_usd_total`` of key ``payer``."""
    text = httpx.get(
        root(gateway) + "/metrics",
        headers={"authorization": f"Bearer {KEYS['admin']}"},
        timeout=DEADLINE,
    ).text
    prefix = 'llmroute_gateway_estimated_spend_usd_total{key="payer"} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_a_cut_or_broken_stream_is_charged_the_prompt_its_vendor_counted(redis_url: str) -> None:
    """A stream its client cuts, or that breaks, before the vendor's usage: Anthropic's
    ``message_start`` had counted its prompt, cache reads apart, so the key is charged that
    prompt (the reads at the cached price, not the whole prompt as fresh input) and the tokens
    sent, and the charge is counted as an estimate (``llmroute_gateway_estimated_spend_usd``,
    and the key's ``estimated_nanos`` in ``GET /admin/usage``, the fleet's through Redis); a
    whole answer is not."""
    system = f"You answer at length, always, as house {uuid.uuid4().hex} says. " * 6
    block = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "system", "content": block}, {"role": "user", "content": "Hi"}]
    profile = Profile(reply_tokens=LONG, inter_token=0.01)
    with ExitStack() as stack:
        sim = stack.enter_context(Simulator(profile=profile, tls=False))
        config = {
            "routing": {"explore": 0},
            "redis": {"url": redis_url, "prefix": f"money-{uuid.uuid4().hex[:8]}"},
            "gateway": {
                "keys": {name: f"GM_{name.upper()}" for name in KEYS},
                "tenants": {
                    "admin": {"admin": True},
                    "payer": {"budget_usd": 1, "budget_period": PERIOD},
                },
                "limits_backend": "redis",
            },
            "providers": {
                name: {
                    "kind": "anthropic",
                    "base_url": sim.base_url,
                    "api_key": "sk-money-upstream",
                    "prices": {"*": CACHED},
                    **more,
                }
                for name, more in (("an", {}), ("br", {"headers": {"x-sim-fault": f"drop:{CUT}"}}))
            },
            "models": {
                name: {"targets": [f"{name}:sim-small"], "continue_on_break": False}
                for name in ("an", "br")
            },
        }
        gateway = stack.enter_context(Gateway(config, environ=ENVIRON, max_retries=0))
        # Whole answers: the first writes the system prompt to the cache, the second reads
        # it (its usage says how much: the cut stream's prompt is the same); both exact.
        used = 0
        for _ in range(2):
            answer = post(gateway, {"model": "an", "messages": messages, "max_tokens": 5})
            assert answer.status_code == 200, answer.text
            wait_for(lambda was=used: spent(gateway) > was, "a whole answer charged")
            used = spent(gateway)
        prompt = answer.json()["usage"]
        reads = cached_tokens(prompt)
        fresh = prompt["prompt_tokens"] - reads
        assert reads > fresh > 0
        assert estimated_metric(gateway) == 0
        assert usage(gateway)["estimated_nanos"] == 0
        body = {"model": "an", "messages": messages, "stream": True, "max_tokens": LONG}
        read = 0
        with (
            httpx.Client(timeout=DEADLINE) as client,
            client.stream(
                "POST",
                root(gateway) + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {KEYS['payer']}"},
            ) as reply,
        ):
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    read += 1
                    if read == 3:
                        break  # the client leaves
        wait_for(lambda: usage(gateway)["requests"] == 3, "the cut stream settled")
        wait_for(lambda: spent(gateway) > used, "the cut stream charged")
        charged = spent(gateway) - used
        # The vendor's count of the prompt (the system prompt read from its cache, at the
        # cached price) and the tokens sent: not the whole prompt as fresh input.
        sent = charged - 1000 * fresh - 250 * reads
        assert sent % 2000 == 0 and read <= sent // 2000 < LONG
        assert estimated_metric(gateway) * 10**9 == pytest.approx(charged)
        for scope in ("fleet", "replica"):  # in Redis, and this replica's own
            figures = usage(gateway, scope)
            assert figures["estimated_nanos"] == charged
            assert Decimal(figures["estimated_usd"]) * 10**9 == charged
        # A stream that breaks after CUT tokens (not continued): the same.
        used, estimated = spent(gateway), charged
        broken = post(gateway, {**body, "model": "br"})
        assert broken.status_code == 200 and '"error"' in broken.text
        wait_for(lambda: usage(gateway)["requests"] == 4, "the broken stream settled")
        wait_for(lambda: spent(gateway) > used, "the broken stream charged")
        charged = spent(gateway) - used
        sent = charged - 1000 * fresh - 250 * reads
        assert sent % 2000 == 0 and CUT <= sent // 2000 < LONG
        assert estimated_metric(gateway) * 10**9 == pytest.approx(estimated + charged)
        assert usage(gateway)["estimated_nanos"] == estimated + charged
