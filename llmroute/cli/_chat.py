"""``llmroute chat``: stream one answer through the routing to the terminal."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from ._format import MissingExtra, add_tls_options, ms, require, tls_verify
from ._parser import examples

if TYPE_CHECKING:
    from .. import AsyncOpenAI
    from .._types import RouteReport, TierDecision, Timings
    from ..config import Config
    from ..pricing import Cost

__all__ = ["register", "route_lines", "tier_line"]

PLAIN_MODEL = "gpt-6-luna"
"""The model asked for without a config and without ``--model`` (the plain OpenAI client)."""

SIMULATOR_MODEL = "chat"
"""The model asked for with ``--simulator`` and without ``--model``: the demo's route over its
three simulated providers (``llmroute demo``)."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "chat",
        help="stream one answer through the routing to the terminal",
        epilog=examples(
            "llmroute chat --simulator 'Hello!' --show-route",
            "llmroute chat --config llmroute.toml --model chat 'What is HTTP/2?'",
            "echo 'Summarise this' | llmroute chat - --json",
        ),
        description=(
            "Stream one answer to stdout as its tokens arrive. With --config (or $LLMROUTE_CONFIG) "
            "the model name is a route; without, this is the plain OpenAI client "
            "(OPENAI_API_KEY, OPENAI_BASE_URL)."
        ),
    )
    parser.add_argument("prompt", help="the user message; '-' reads it from stdin")
    parser.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    parser.add_argument(
        "--simulator",
        action="store_true",
        help=(
            "route over the demo's three simulated providers on 127.0.0.1 (route 'chat'; TLS, "
            "HTTP/2; no API key, no config)"
        ),
    )
    parser.add_argument(
        "--model",
        help=(
            "the route or model name (default: the config's only route, else 'chat'; "
            f"without a config {PLAIN_MODEL!r})"
        ),
    )
    parser.add_argument("--system", help="a system message before the prompt")
    parser.add_argument("--max-tokens", type=int, help="max_tokens of the request")
    parser.add_argument("--temperature", type=float, help="sampling temperature")
    parser.add_argument(
        "--show-route",
        action="store_true",
        help=(
            "afterwards, print the winner, every attempt, a tiered name's decision and the "
            "timings to stderr"
        ),
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=(
            "print one JSON document on stdout when the answer ends: its text, the route "
            "report and the timings (and the error, if it failed), nothing else"
        ),
    )
    add_tls_options(parser)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    prompt: str = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        sys.stderr.write("llmroute chat: the prompt is empty\n")
        return 2
    try:
        args.verify = tls_verify(args, "llmroute chat")
        if args.simulator:
            if args.config:
                raise ValueError("llmroute chat: --simulator and --config do not go together")
            require("hypercorn", "testing")
            require("trustme", "testing")
    except MissingExtra as exc:
        sys.stderr.write(f"llmroute chat: {exc}\n")
        return 2
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    try:
        if args.simulator:
            return _with_simulator(args, prompt)
        return anyio.run(_chat, args, prompt)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        sys.stderr.write("llmroute chat: interrupted\n")
        return 130


def _with_simulator(args: argparse.Namespace, prompt: str) -> int:
    from ._demo_setup import demo_simulators, simulated_setup

    with demo_simulators() as sims:
        setup = simulated_setup(sims)
        first = next(iter(sims.values()))  # a name that is not a route: asked of it alone
        simulated = {
            "api_key": "sk-simulator-local",
            "base_url": first.base_url,
            "config": setup.config,
            "verify": setup.verify,
        }
        return anyio.run(_chat, args, prompt, simulated)


async def _chat(
    args: argparse.Namespace, prompt: str, simulated: dict[str, Any] | None = None
) -> int:
    from .. import OpenAIError, StreamInterrupted, UnknownModelError
    from ..config import ConfigError

    out: TextIO | _Collector = sys.stdout
    err = sys.stderr
    try:
        client, config = _client(args, simulated)
    except ConfigError as exc:
        err.write(f"llmroute chat: {exc}\n")
        return 2
    except OpenAIError as exc:  # no OPENAI_API_KEY for the plain client
        err.write(f"llmroute chat: {exc} (or try 'llmroute chat --simulator ...': no key needed)\n")
        return 2
    model = args.model
    if model is None:
        model = _default_model(config, simulated is not None)
    messages, extra = _request(args, prompt)
    route: RouteReport | None = None
    timings: Timings | None = None
    status = 0
    wrote = False
    text: list[str] = []
    failure: str | None = None
    if args.json:  # the text is kept for the JSON document, not streamed to the terminal
        out = _Collector(text)
    async with client:
        try:
            stream = await client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                **extra,
            )
            route, timings = stream.route, stream.timings
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        out.write(chunk.choices[0].delta.content)
                        out.flush()
                        wrote = True
            route, timings = stream.route, stream.timings
        except StreamInterrupted as exc:
            status = 1
            _finish_line(out, wrote)
            failure = f"the answer broke off: {type(exc).__name__}: {_one_line(str(exc))}"
            err.write(f"llmroute chat: {failure}\n")
        except UnknownModelError as exc:  # a name mistake ("did you mean 'chat'?"): usage
            status = 2
            err.write(f"llmroute chat: {_one_line(str(exc))}\n")
        except OpenAIError as exc:
            status = 1
            _finish_line(out, wrote)
            failure = f"{type(exc).__name__}: {_one_line(str(exc))}"
            err.write(f"llmroute chat: {failure}\n")
            route = getattr(exc, "report", None) or route
        else:
            _finish_line(out, True)
    if args.json and status != 2:  # a usage mistake sent nothing: no document
        document = {
            "model": model,
            "content": "".join(text).removesuffix("\n"),
            "error": failure,
            "route": _plain(route),
            "timings": _plain(timings),
        }
        sys.stdout.write(json.dumps(document, default=_json_default) + "\n")
    if args.show_route:
        for line in route_lines(route, timings, model):
            err.write(line + "\n")
    return status


def _client(
    args: argparse.Namespace, simulated: dict[str, Any] | None
) -> tuple[AsyncOpenAI, Config | None]:
    """The client, over the demo's simulators, the config's routes or plain openai's, and the
    config; ConfigError for a bad config, OpenAIError with no key for the plain client."""
    from .. import AsyncOpenAI
    from ..config import load_config

    if simulated is not None:
        return AsyncOpenAI(**simulated), None  # the demo's route over its three simulators
    config = load_config(args.config)
    verify = getattr(args, "verify", True)
    if config is not None:
        return AsyncOpenAI(config=config, verify=verify), config
    return AsyncOpenAI(verify=verify), None


def _default_model(config: Config | None, simulated: bool) -> str:
    """The model name asked for without ``--model``: the simulator's, the plain client's, the
    config's only route, else ``chat``."""
    if simulated:
        return SIMULATOR_MODEL
    if config is None:
        return PLAIN_MODEL
    return next(iter(config.models)) if len(config.models) == 1 else "chat"


def _request(args: argparse.Namespace, prompt: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The request's messages (the ``--system`` prompt, then ``prompt``) and its options."""
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": prompt})
    extra: dict[str, Any] = {}
    if args.max_tokens is not None:
        extra["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    return messages, extra


class _Collector:
    """Where ``--json`` keeps the answer's text instead of the terminal."""

    def __init__(self, parts: list[str]) -> None:
        self.parts = parts

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def _plain(record: Any) -> Any:
    """A route report or timings as plain data for JSON (``None`` stays ``None``); a report's
    ``cost`` is added (amounts as decimal strings), its pricing machinery left out."""
    if record is None:
        return None
    cost = getattr(record, "cost", None)  # a report's: prices its attempts first
    if hasattr(record, "pricer"):
        record = dataclasses.replace(record, pricer=None, saved=None)
    data = dataclasses.asdict(record)
    for machinery in ("pricer", "saved", "prompt_tokens"):
        data.pop(machinery, None)
    if hasattr(record, "pricer"):
        data["cost"] = None if cost is None else dataclasses.asdict(cost)
    return data


def _json_default(value: Any) -> Any:
    """openai's objects in a report (a usage) as their fields; anything else as text."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(value)


def _finish_line(out: TextIO | _Collector, wrote: bool) -> None:
    if wrote:
        out.write("\n")
        out.flush()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def tier_line(decision: TierDecision) -> str:
    """A tiered model name's decision in one line: where it went, its class and why."""
    line = (
        f"  tier: {decision.model!r} -> {decision.tier}: class {decision.label or '-'}, "
        f"probability {decision.probability:.2f}, reason {decision.reason}, "
        f"{decision.micros:.0f} us"
    )
    if decision.chosen is not None and decision.chosen != decision.tier:
        line += f" (its class's tier: {decision.chosen})"
    if decision.hedged is not None:
        line += f" (started on {decision.hedged[0]}, hedged to {decision.hedged[1]})"
    if decision.error:
        line += f" ({_one_line(decision.error)})"
    return line


def _money(cost: Cost) -> str:
    """An attempt's cost, short: ``cost 0.000236 USD``, ``~`` before an estimate."""
    if cost.amount is None:
        return "cost unknown"
    approx = "~" if cost.estimated and cost.amount else ""
    return f"cost {approx}{cost.amount.normalize():f} {cost.currency or ''}".rstrip()


def route_lines(route: RouteReport | None, timings: Timings | None, model: str) -> list[str]:
    """A human summary of how one request was served: the route report, then the timings."""
    lines: list[str] = []
    if route is None:
        lines.append(f"route: none ({model!r} is not a route: the client's own base_url)")
    else:
        lines.append(str(route))  # the report's own one line
        if route.tier is not None:
            lines.append(tier_line(route.tier))
        if route.reason:
            lines.append(f"  why: {route.reason}")
        if route.explored:
            lines.append(f"  explored: {route.explored}")
        if route.continued_on:
            lines.append(f"  continued on: {', '.join(route.continued_on)}")
        for target, why in route.left_out.items():
            lines.append(f"  left out: {target} ({why})")
        if route.usage_estimated:
            lines.append(f"  usage counted by llmroute: {', '.join(route.usage_estimated)}")
        cost = route.cost
        if cost is not None:
            lines.append(f"  {cost}")
        width = max((len(a.target) for a in route.attempts), default=0)
        for index, attempt in enumerate(route.attempts, 1):
            line = (
                f"  attempt {index}: {attempt.target:{width}}  {attempt.reason:12} "
                f"at +{ms(attempt.started):>7}  {attempt.outcome:12} TTFT {ms(attempt.ttft)}"
            )
            if attempt.tokens is not None:
                bound = ">= " if attempt.tokens_counted in ("estimate", "deltas") else ""
                line += f"  {bound}{attempt.tokens} tokens"
                estimate = attempt.tokens_estimate
                if estimate is not None and estimate != attempt.tokens:
                    line += f" (~{estimate} estimated)"
            if attempt.cost is not None:
                line += f"  {_money(attempt.cost)}"
            if attempt.request_id:
                line += f"  request id {attempt.request_id}"
            if attempt.error:
                line += f"  ({_one_line(attempt.error)})"
            lines.append(line)
    if timings is not None and timings.first_token is not None:
        reused = timings.connection_reused
        connection = "-" if reused is None else ("reused" if reused else "new")
        lines.append(
            f"timings: {timings.http_version or '-'}, connection {connection}, "
            f"connect {ms(timings.connect)}, headers {ms(timings.headers)}, "
            f"first token {ms(timings.first_token)}, total {ms(timings.total)}, "
            f"{timings.tokens} tokens, {timings.retries} retries"
        )
    return lines
