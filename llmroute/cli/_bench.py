"""``llmroute bench``: measure each target's time to first token (P50/P95/P99 by prompt length).

Every target is probed directly, one request to one target (no routing, no retries, no cache), so
its numbers are that vendor's own. The probes use a fixed prompt set per length class, each
prompt starting with a unique nonce by default so that no vendor's prompt cache hides the
prefill, and they are interleaved across targets and classes so that drift hits all alike.

``--routed ROUTE`` sends the same prompts through a route instead (routing, hedges, failover and
the cache as the application meets them) and keeps each request's route report, compactly, for
``--json`` and for the picture of the run; ``--replot`` draws a saved run again without traffic.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import random
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._streaming import AsyncStream
from ._bench_plot import HEAVY_TAIL, SCALES
from ._format import (
    MissingExtra,
    add_tls_options,
    check_output_path,
    check_plot_path,
    error_text,
    make_console,
    ms,
    percentiles,
    progress_bar,
    require,
    table,
    tls_verify,
)
from ._parser import examples

if TYPE_CHECKING:
    from rich.console import Console

    from .. import AsyncOpenAI
    from .._simulated import SimulatedProviders
    from ..config import Config, SimulatorAddress

__all__ = ["LENGTHS", "Probe", "prompt_for", "register", "summarize"]

LENGTHS: dict[str, int] = {"short": 50, "medium": 1000, "long": 4000}
"""The prompt-length classes and their approximate prompt size in tokens (4 characters each)."""

_QUESTIONS = (
    "Summarize the text above in one sentence.",
    "Which component does the text above describe first?",
    "Name one risk the text above mentions.",
    "What would you measure first, after reading the text above?",
)

_WORDS = (
    "request target vendor stream token latency prefill decode queue server client window "
    "percentile hedge route cache failover connection handshake stall budget prompt answer "
    "region replica batch scheduler kernel memory throughput deadline retry breaker probe"
).split()


def _filler(tokens: int) -> str:
    """Fixed text of about ``tokens`` tokens (the same on every run)."""
    rng = random.Random(tokens)
    words: list[str] = []
    chars = 0
    while chars < tokens * 4:
        word = rng.choice(_WORDS)
        words.append(word)
        chars += len(word) + 1
    return " ".join(words)


def prompt_for(length: str, index: int, nonce: str | None) -> list[dict[str, str]]:
    """The messages of probe ``index`` of a length class: fixed text, then a question.

    With a ``nonce`` the prompt starts with it, so no two probes share a prefix."""
    tokens = LENGTHS[length]
    head = f"[probe {nonce}] " if nonce else ""
    question = _QUESTIONS[index % len(_QUESTIONS)]
    body = _filler(max(tokens - 20, 8))
    return [{"role": "user", "content": f"{head}{body}\n\n{question}"}]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure each target's time to first token (P50/P95/P99 by prompt length)",
        epilog=examples(
            "llmroute bench --simulator --probes 5 --plot bench.svg",
            "llmroute bench --config llmroute.toml --lengths short,long --json bench.json",
            "llmroute bench --replot bench.json --plot bench.png --plot-scale log",
        ),
        description=(
            "Probe every target of every route (or --targets) directly, streamed, with a fixed "
            "prompt set at several prompt lengths, and report TTFT percentiles per target and "
            "length class."
        ),
    )
    parser.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    parser.add_argument(
        "--simulator",
        action="store_true",
        help="probe three local simulated providers (the demo's) instead of a config's targets",
    )
    parser.add_argument(
        "--targets", help="only these targets, comma-separated provider:model (default: all)"
    )
    parser.add_argument(
        "--probes", type=int, default=20, help="probes per target and length class (20)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="probes in flight at once (4)")
    parser.add_argument(
        "--lengths",
        default="short,medium,long",
        help="length classes, comma-separated: short (~50 tokens), medium (~1000), long (~4000)",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens per probe (16)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one probe may take (60)"
    )
    parser.add_argument(
        "--no-nonce",
        dest="nonce",
        action="store_false",
        help="send the same prompts every time (lets vendors' prompt caches help)",
    )
    parser.add_argument(
        "--repeat",
        type=float,
        default=0.0,
        metavar="SHARE",
        help=(
            "share of probes sent without their nonce, so the same few prompts come back (a "
            "route's cache, a vendor's prompt cache can answer them); 0 by default"
        ),
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        nargs="?",
        const="-",
        metavar="FILE",
        help=(
            "write raw samples and summary here; without FILE (or -), print them as one JSON "
            "document on stdout and everything else on stderr"
        ),
    )
    parser.add_argument(
        "--plot",
        help=(
            "write a picture here, PNG, SVG or PDF by the file's extension (needs "
            "llmroute[plot]): the TTFT distributions, or with --routed the run over time"
        ),
    )
    parser.add_argument(
        "--plot-scale",
        choices=SCALES,
        default="auto",
        help=(
            "the TTFT axis of --plot: log, linear, or auto (log when the slowest first token is "
            f"{HEAVY_TAIL:g}x the median or more; the default)"
        ),
    )
    parser.add_argument(
        "--routed",
        nargs="?",
        const="",
        metavar="ROUTE",
        help=(
            "send the probes through this route of the config (with --simulator: the demo's "
            "hedge route over the three, with a memory cache), not to each target alone"
        ),
    )
    parser.add_argument(
        "--replot",
        metavar="JSON",
        help="draw --plot again from a saved --json run, without sending anything",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the probe order (0)")
    add_tls_options(parser)
    parser.set_defaults(run=_run)


@dataclass(slots=True)
class Probe:
    """One probe: where it went, and what it measured (seconds; ``None`` when it failed)."""

    target: str
    length: str
    index: int
    prompt_chars: int
    started: float
    """Seconds after the bench began."""
    ttft: float | None = None
    total: float | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    http_version: str | None = None
    error: str | None = None
    route: dict[str, Any] | None = None
    """A routed probe's route report, compactly (:func:`compact_report`); ``None`` for a probe
    sent to one target directly."""
    cost: str | None = None
    """A routed probe's cost (``route.cost``, every attempt), an exact decimal; ``None`` when
    unknown (no price for a target's model) or not routed."""
    currency: str | None = None


def compact_report(report: Any) -> dict[str, Any]:
    """What the picture of a routed run needs of a :class:`~llmroute.RouteReport`: who served
    it, its hedges, continuations, cache hit, and each attempt (times in seconds)."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    attempts: list[dict[str, Any]] = []
    for attempt in report.attempts:
        item: dict[str, Any] = {
            "target": attempt.target,
            "reason": attempt.reason,
            "outcome": attempt.outcome,
            "started": rounded(attempt.started),
            "ttft": rounded(attempt.ttft),
        }
        if attempt.error:
            item["error"] = " ".join(str(attempt.error).split())[:120]
        attempts.append(item)
    return {
        "winner": report.winner,
        "ttft": rounded(report.ttft),
        "hedges": report.hedges,
        "cache_hit": report.cache_hit,
        "shared": report.shared,
        "continued_on": list(report.continued_on),
        "attempts": attempts,
    }


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How to reach one target directly."""

    target: str
    model: str
    client_args: dict[str, Any]
    secrets: tuple[str, ...] = ()


def _run(args: argparse.Namespace) -> int:
    if args.replot:
        return _replot(args)
    lengths = [part.strip() for part in args.lengths.split(",") if part.strip()]
    unknown = [name for name in lengths if name not in LENGTHS]
    if not lengths or unknown:
        sys.stderr.write(
            f"llmroute bench: unknown length class {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(LENGTHS)}\n"
        )
        return 2
    if args.probes < 1 or args.concurrency < 1 or args.max_tokens < 1:
        sys.stderr.write(
            "llmroute bench: --probes, --concurrency and --max-tokens must be at least 1\n"
        )
        return 2
    if not 0 <= args.repeat <= 1:
        sys.stderr.write(f"llmroute bench: --repeat must be between 0 and 1, got {args.repeat:g}\n")
        return 2
    if not args.timeout > 0:
        sys.stderr.write(
            f"llmroute bench: --timeout must be above 0 seconds, got {args.timeout:g}\n"
        )
        return 2
    try:
        args.verify = tls_verify(args, "llmroute bench")
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    if args.routed is not None and args.targets:
        sys.stderr.write(
            "llmroute bench: --targets picks targets to probe alone; --routed sends every probe "
            "through the route (choose one)\n"
        )
        return 2
    for path, flag, check in (
        (args.json_path if args.json_path != "-" else None, "--json", check_output_path),
        (args.plot, "--plot", check_plot_path),
    ):
        problem = check(path, flag) if path else None
        if problem:
            sys.stderr.write(f"llmroute bench: {problem}\n")
            return 2
    try:
        require("rich", "cli")
        if args.plot:
            require("matplotlib", "plot")
        if args.simulator:
            require("hypercorn", "cli")
            require("trustme", "cli")
    except MissingExtra as exc:
        sys.stderr.write(f"llmroute bench: {exc}\n")
        return 2
    try:
        return anyio.run(_bench, args, lengths)
    except KeyboardInterrupt:
        sys.stderr.write("llmroute bench: interrupted\n")
        return 130


def _replot(args: argparse.Namespace) -> int:
    """``--replot JSON --plot FILE``: the picture of a saved run, and nothing sent."""
    sending = [
        flag
        for flag, given in (
            ("--simulator", args.simulator),
            ("--config", args.config),
            ("--routed", args.routed is not None),
            ("--targets", args.targets),
            ("--json", args.json_path),
        )
        if given
    ]
    if sending:
        sys.stderr.write(
            f"llmroute bench: --replot draws a saved run and sends nothing; drop "
            f"{', '.join(sending)}\n"
        )
        return 2
    if not args.plot:
        sys.stderr.write("llmroute bench: --replot needs --plot FILE (the picture to write)\n")
        return 2
    problem = check_plot_path(args.plot, "--plot")
    if problem:
        sys.stderr.write(f"llmroute bench: {problem}\n")
        return 2
    try:
        require("matplotlib", "plot")
    except MissingExtra as exc:
        sys.stderr.write(f"llmroute bench: {exc}\n")
        return 2
    try:
        data = json.loads(Path(args.replot).read_text(encoding="utf-8"))
    except OSError as exc:
        sys.stderr.write(
            f"llmroute bench: --replot {args.replot}: cannot read it: {exc.strerror or exc}\n"
        )
        return 2
    except ValueError as exc:
        sys.stderr.write(f"llmroute bench: --replot {args.replot}: not JSON ({exc})\n")
        return 2
    problem = _saved_run_problem(data)
    if problem:
        sys.stderr.write(
            f"llmroute bench: --replot {args.replot}: {problem}; "
            "expected the output of llmroute bench --json\n"
        )
        return 2
    try:
        _plot(Path(args.plot), data, args.plot_scale)
    except OSError as exc:
        sys.stderr.write(f"llmroute bench: cannot write {exc.filename}: {exc.strerror or exc}\n")
        return 1
    print(f"wrote {args.plot}")
    return 0


def _saved_run_problem(data: Any) -> str | None:
    """Why ``data`` is not a bench run the pictures can draw, naming the field; else ``None``."""
    if not isinstance(data, dict):
        return "not a JSON object"
    fields: dict[str, type] = {"settings": dict, "targets": list, "samples": list}
    for name, kind in fields.items():
        if not isinstance(data.get(name), kind):
            return f"the field {name!r} is missing or not a {kind.__name__}"
    lengths = data["settings"].get("lengths")
    if not isinstance(lengths, dict) or not lengths:
        return "the field 'settings.lengths' is missing or empty (one length class at least)"
    for index, sample in enumerate(data["samples"]):
        if not isinstance(sample, dict) or not {"target", "length", "started"} <= sample.keys():
            return f"samples[{index}] lacks 'target', 'length' or 'started'"
        route = sample.get("route")
        if route is None:
            continue
        attempts = route.get("attempts") if isinstance(route, dict) else None
        if not isinstance(attempts, list) or not all(
            isinstance(a, dict) and {"target", "reason", "outcome", "started"} <= a.keys()
            for a in attempts
        ):
            return (
                f"samples[{index}].route lacks 'attempts' (each with 'target', 'reason', "
                "'outcome' and 'started')"
            )
    return None


def _wanted(args: argparse.Namespace) -> list[str] | None:
    if not args.targets:
        return None
    return [part.strip() for part in args.targets.split(",") if part.strip()]


async def _bench(args: argparse.Namespace, lengths: list[str]) -> int:
    import contextlib

    # --json on stdout: the JSON document alone there; the progress and tables on stderr.
    console = make_console(sys.stderr if args.json_path == "-" else None)
    if args.simulator:
        from ..testing import Simulator
        from ._demo import SIM_MODEL, _demo_profiles

        with contextlib.ExitStack() as stack:
            endpoints: list[_Endpoint] = []
            sims: dict[str, Simulator] = {}
            for name, profile in _demo_profiles().items():
                # Prefill grows with the prompt, as on a real server: 20 ms per 1,000 tokens.
                profile = dataclasses.replace(profile, ttft_per_prompt_token=2e-5)
                sim = sims[name] = stack.enter_context(Simulator(profile=profile, tls=True))
                endpoints.append(
                    _Endpoint(
                        f"{name}:{SIM_MODEL}",
                        SIM_MODEL,
                        {
                            "api_key": "sk-bench-local",
                            "base_url": sim.base_url,
                            "verify": sim.ssl_context(),
                            "max_retries": 0,
                        },
                    )
                )
            if args.routed is not None:
                from ._demo import ROUTE, simulated_setup

                if args.routed not in ("", ROUTE):
                    sys.stderr.write(
                        f"llmroute bench: unknown route {args.routed!r}; with --simulator the "
                        f"route is {ROUTE!r} (or give --routed alone)\n"
                    )
                    return 2
                setup = simulated_setup(sims)
                routed = _Endpoint(
                    ROUTE,
                    ROUTE,
                    {"api_key": "unused", "config": setup.config, "verify": setup.verify},
                    ("sk-demo-local",),
                )
                label = "simulated providers (the demo's hedge route, memory cache)"
                return await _measure(console, [routed], lengths, args, label, setup.targets)
            selected, missing = _select(endpoints, _wanted(args))
            if missing:
                return _missing(missing, endpoints)
            return await _measure(console, selected, lengths, args, "simulated providers")
    from .._simulated import SimulatedProviders
    from ..config import ConfigError, load_config

    try:
        config = load_config(args.config)
        if config is None:
            raise ConfigError(
                "no config: pass --config FILE or set LLMROUTE_CONFIG (or use --simulator)"
            )
        simulated = SimulatedProviders(config)  # the config's simulated providers, if any
    except ConfigError as exc:
        sys.stderr.write(f"llmroute bench: {exc}\n")
        return 2
    try:
        return await _bench_config(console, config, simulated, lengths, args)
    finally:
        await anyio.to_thread.run_sync(simulated.stop)


async def _bench_config(
    console: Console,
    config: Config,
    simulated: SimulatedProviders,
    lengths: list[str],
    args: argparse.Namespace,
) -> int:
    from ..config import ConfigError

    try:
        endpoints = _config_endpoints(config, args.verify, simulated.addresses)
        if args.routed is not None:
            routed, targets = _routed_endpoint(
                config, args.routed, args.verify, endpoints, simulated.addresses
            )
            return await _measure(console, [routed], lengths, args, config.source, targets)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute bench: {exc}\n")
        return 2
    selected, missing = _select(endpoints, _wanted(args))
    if missing:
        return _missing(missing, endpoints)
    endpoints = selected
    if not endpoints:
        sys.stderr.write(f"llmroute bench: {config.source}: no routes, so no targets to probe\n")
        return 2
    return await _measure(console, endpoints, lengths, args, config.source)


def _routed_endpoint(
    config: Config,
    name: str,
    verify: bool | str,
    endpoints: list[_Endpoint],
    simulated: Mapping[str, SimulatorAddress] | None = None,
) -> tuple[_Endpoint, list[str]]:
    """The route ``name`` of ``config`` (or its only route when ``name`` is empty) as one
    endpoint, with the targets it may send to. Raises ConfigError naming the routes there are."""
    from ..config import ConfigError, resolve

    resolved = resolve(config, simulated=simulated)
    names = [*resolved.routes, *config.tiered]
    if not name:
        if len(names) != 1:
            raise ConfigError(
                f"{config.source}: --routed needs a route name; the routes are: "
                f"{', '.join(names) or '(none)'}"
            )
        name = names[0]
    if name in resolved.routes:
        targets = [t.name for t in resolved.routes[name]]
    elif name in config.tiered:
        tiers = config.tiered[name]
        tier_routes = dict.fromkeys([*tiers.tiers.values(), tiers.default])
        targets = list(
            dict.fromkeys(t.name for route in tier_routes for t in resolved.routes.get(route, []))
        )
    else:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{config.source}: --routed {name!r} is no route of the config{hint}; the routes "
            f"are: {', '.join(names) or '(none)'}"
        )
    secrets = tuple(dict.fromkeys(s for e in endpoints for s in e.secrets))
    client_args: dict[str, Any] = {"api_key": "unused", "config": config, "verify": verify}
    return _Endpoint(name, name, client_args, secrets), targets


def _select(
    endpoints: list[_Endpoint], wanted: list[str] | None
) -> tuple[list[_Endpoint], list[str]]:
    if wanted is None:
        return endpoints, []
    known = {e.target: e for e in endpoints}
    return [known[t] for t in wanted if t in known], [t for t in wanted if t not in known]


def _missing(missing: list[str], endpoints: list[_Endpoint]) -> int:
    """``missing`` named, with every target that could have been (all, not only the selected)."""
    known = [e.target for e in endpoints]
    hints = ""
    for name in missing:
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            hints += f" (did you mean {close[0]!r} for {name!r}?)"
    sys.stderr.write(
        f"llmroute bench: unknown target {', '.join(missing)}{hints}; "
        f"the targets are: {', '.join(known) or '(none: the config has no routes)'}\n"
    )
    return 2


def _config_endpoints(
    config: Config,
    verify: bool | str = True,
    simulated: Mapping[str, SimulatorAddress] | None = None,
) -> list[_Endpoint]:
    """Every target of every route, once, with what reaches it directly (``simulated``: where
    the config's running simulated providers answer).

    A provider's own ``verify`` (in the config) wins over ``verify`` (``--ca``/``--insecure``).
    """
    from .._secrets import provider_secrets
    from ..config import resolve, route_config
    from ..protocols import adapter_for

    resolved = resolve(config, simulated=simulated)
    endpoints: list[_Endpoint] = []
    for target in resolved.targets():
        provider = resolved.providers[target.provider]
        # Its key and the values of its credential headers (api-key, x-api-key, ...).
        secrets = tuple(provider_secrets([provider]))
        if adapter_for(provider.spec.protocol).speaks_openai:
            client_args: dict[str, Any] = {
                "api_key": provider.api_key or "none",
                "base_url": str(provider.base_url),
                "default_headers": dict(provider.headers),
                "max_retries": 0,
                "verify": verify if provider.verify is None else provider.verify,
            }
            endpoints.append(_Endpoint(target.name, target.model, client_args, secrets))
            continue
        # Another wire protocol: a route with this one target and nothing else (no retry,
        # no breaker, no cache) speaks it.
        probe = config.model_copy(
            update={
                "models": {
                    "probe": route_config("probe", {"targets": [target.name], "policy": "failover"})
                },
                "cache": None,
                "default_provider": None,
                "routing": config.routing.model_copy(
                    update={"breaker_failures": 10**9, "explore": 0.0}
                ),
            }
        )
        client_args = {"api_key": "unused", "config": probe, "max_retries": 0, "verify": verify}
        endpoints.append(_Endpoint(target.name, "probe", client_args, secrets))
    return endpoints


async def _probe(
    client: AsyncOpenAI, endpoint: _Endpoint, sample: Probe, messages: Any, args: Any
) -> None:
    if getattr(args, "routed", None) is not None:
        await _routed_probe(client, endpoint, sample, messages, args)
        return
    try:
        with anyio.fail_after(args.timeout):
            stream = await _open_stream(client, endpoint, messages, args)
            async with stream:
                async for _ in stream:
                    pass
        assert isinstance(stream, AsyncStream)  # llmroute's: it carries its timings
        timings = stream.timings
        sample.ttft = timings.first_token
        sample.total = timings.total
        sample.tokens = timings.tokens
        sample.http_version = timings.http_version
        if timings.first_token is None:
            sample.error = "NoToken: the stream ended without a token"
        elif timings.total is not None and timings.tokens > 1:
            decode = timings.total - timings.first_token
            if decode > 0:
                sample.tokens_per_s = (timings.tokens - 1) / decode
    except TimeoutError:
        sample.error = f"Timeout: no complete answer within {args.timeout:g} s"
    except Exception as exc:
        # One probe's failure, whatever it is (OpenAIError or anything else), is its error and
        # never ends the run; KeyboardInterrupt and cancellation are no Exceptions, so they do.
        sample.error = _error_line(exc, endpoint)


async def _routed_probe(
    client: AsyncOpenAI, endpoint: _Endpoint, sample: Probe, messages: Any, args: Any
) -> None:
    """One request through the route: TTFT as the caller saw it (hedges included, a cache hit's
    replay), ``total`` from ``create()`` to the end (or to the failure), and the route report."""
    began = time.perf_counter()
    stream: Any = None
    report: Any = None
    try:
        with anyio.fail_after(args.timeout):
            stream = await _open_stream(client, endpoint, messages, args)
            async with stream:
                async for _ in stream:
                    pass
        report = stream.route
        timings = stream.timings
        sample.tokens = timings.tokens
        sample.http_version = timings.http_version
        sample.ttft = report.ttft if report is not None else timings.first_token
        if sample.ttft is None:
            sample.error = "NoToken: the stream ended without a token"
    except TimeoutError:
        sample.error = f"Timeout: no complete answer within {args.timeout:g} s"
    except Exception as exc:  # as in _probe: one request's failure never ends the run
        sample.error = _error_line(exc, endpoint)
        report = getattr(exc, "report", None)
    sample.total = time.perf_counter() - began
    if report is None and stream is not None:
        report = getattr(stream, "route", None)
    if report is not None:
        sample.route = compact_report(report)
        cost = report.cost
        if cost is not None and cost.amount is not None:
            sample.cost, sample.currency = str(cost.amount), cost.currency
    replayed = sample.route is not None and (sample.route["cache_hit"] or sample.route["shared"])
    if sample.ttft is not None and sample.error is None and sample.tokens > 1 and not replayed:
        decode = sample.total - sample.ttft
        if decode > 0:
            sample.tokens_per_s = (sample.tokens - 1) / decode


async def _open_stream(client: AsyncOpenAI, endpoint: _Endpoint, messages: Any, args: Any) -> Any:
    """One streamed request of the run's shape (the caller reads it, and keeps it when the
    read fails: its timings and route report are on it)."""
    return await client.chat.completions.create(
        model=endpoint.model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
    )


def _error_line(exc: BaseException, endpoint: _Endpoint) -> str:
    """A probe's failure as one line, without the endpoint's secrets."""
    message = _scrub(error_text(exc), endpoint.secrets)
    return f"{type(exc).__name__}: {message[:300]}"


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` without ``secrets`` (longest first), also as JSON escapes them."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "<key>")
        escaped = json.dumps(secret)[1:-1]
        if escaped != secret:
            text = text.replace(escaped, "<key>")
    return text


async def _measure(
    console: Console,
    endpoints: list[_Endpoint],
    lengths: list[str],
    args: argparse.Namespace,
    source: str,
    route_targets: list[str] | None = None,
) -> int:
    """Probe ``endpoints`` (or, with ``route_targets``, one routed endpoint whose route sends
    to them), print the tables, and write ``--json`` and ``--plot``."""
    from contextlib import AsyncExitStack

    from .. import AsyncOpenAI

    plan = [
        (endpoint, length, index)
        for index in range(args.probes)
        for length in lengths
        for endpoint in endpoints
    ]
    # Interleaved: each round has every (target, length) once, in a seeded shuffled order.
    rng = random.Random(args.seed)
    rounds = len(lengths) * len(endpoints)
    for start in range(0, len(plan), rounds):
        chunk = plan[start : start + rounds]
        rng.shuffle(chunk)
        plan[start : start + rounds] = chunk
    # Which probes repeat a prompt (no nonce): drawn once, in plan order, from the seed.
    repeats = random.Random(args.seed + 1)
    fresh = [args.nonce and repeats.random() >= args.repeat for _ in plan]
    what = (
        f"route {endpoints[0].target!r} over {len(route_targets)} targets"
        if route_targets is not None
        else f"{len(endpoints)} targets"
    )
    per = "length class" if route_targets is not None else "target and length class"
    if not args.nonce:
        nonces = "no nonce"
    elif args.repeat > 0:
        nonces = f"{sum(not f for f in fresh)} probes repeat a prompt, the others have a nonce"
    else:
        nonces = "a unique nonce per prompt"
    console.print(
        f"llmroute bench: {what} from {source}, {args.probes} probes per "
        f"{per} ({', '.join(lengths)}), {args.concurrency} at a time, "
        f"max_tokens {args.max_tokens}, {nonces}"
    )
    began = time.perf_counter()
    samples: list[Probe] = []
    step = max(1, len(plan) // 4)
    async with AsyncExitStack() as stack:
        clients: dict[str, AsyncOpenAI] = {}
        for endpoint in endpoints:
            client = await stack.enter_async_context(AsyncOpenAI(**endpoint.client_args))
            clients[endpoint.target] = client
        async with anyio.create_task_group() as tg:
            for endpoint in endpoints:
                tg.start_soon(_warm, clients[endpoint.target])
        with progress_bar(console, disable=not console.is_terminal) as progress:
            task = progress.add_task("probes", total=len(plan))

            pending = iter(zip(plan, fresh, strict=True))

            async def worker() -> None:
                # A pool of --concurrency workers takes the probes in plan order.
                for (endpoint, length, index), unique in pending:
                    nonce = uuid.uuid4().hex[:12] if unique else None
                    messages = prompt_for(length, index, nonce)
                    sample = Probe(
                        endpoint.target,
                        length,
                        index,
                        sum(len(m["content"]) for m in messages),
                        started=time.perf_counter() - began,
                    )
                    await _probe(clients[endpoint.target], endpoint, sample, messages, args)
                    samples.append(sample)
                    progress.advance(task)
                    if not console.is_terminal and len(samples) % step == 0:
                        console.print(f"probes: {len(samples)}/{len(plan)} done")

            async with anyio.create_task_group() as tg:
                for _ in range(min(args.concurrency, len(plan))):
                    tg.start_soon(worker)
    wall = time.perf_counter() - began
    summary = summarize(samples, [e.target for e in endpoints], lengths)
    console.print(_summary_table(summary, routed=route_targets is not None))
    if route_targets is not None:
        console.print(_served_table(samples, route_targets))
    errors = [s for s in samples if s.error is not None]
    if errors:
        console.print(f"{len(errors)} of {len(samples)} probes failed; first causes:")
        seen: set[tuple[str, str]] = set()
        for sample in errors:
            cause = sample.error or ""
            if (sample.target, cause[:60]) in seen or len(seen) >= 6:
                continue
            seen.add((sample.target, cause[:60]))
            console.print(f"  {sample.target}: {cause[:160]}")
    console.print(f"{len(samples)} probes in {wall:.1f} s")
    status = 0
    data = _run_data(samples, summary, endpoints, lengths, args, wall, route_targets)
    try:
        if args.json_path == "-":
            sys.stdout.write(_json_text(data, endpoints) + "\n")
        elif args.json_path:
            _write_json(Path(args.json_path), data, endpoints)
            console.print(f"wrote {args.json_path}")
        if args.plot:
            _plot(Path(args.plot), data, args.plot_scale)
            console.print(f"wrote {args.plot}")
    except OSError as exc:
        sys.stderr.write(f"llmroute bench: cannot write {exc.filename}: {exc.strerror or exc}\n")
        status = 1
    return status


async def _warm(client: AsyncOpenAI) -> None:
    try:
        with anyio.fail_after(15):
            await client.warmup()
    except Exception:  # also an ExceptionGroup: the probes will say what failed
        pass


def summarize(
    samples: Sequence[Probe], targets: Sequence[str], lengths: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per target and length class: probes, errors, TTFT p50/p95/p99, mean tokens/s,
    and for routed probes what 1,000 such requests cost (``None`` unless every one's cost is
    known)."""
    rows: list[dict[str, Any]] = []
    for target in targets:
        for length in lengths:
            group = [s for s in samples if s.target == target and s.length == length]
            ttfts = [s.ttft for s in group if s.ttft is not None and s.error is None]
            speeds = [s.tokens_per_s for s in group if s.tokens_per_s is not None]
            p50, p95, p99 = percentiles(ttfts)
            rows.append(
                {
                    "target": target,
                    "length": length,
                    "probes": len(group),
                    "ok": len(ttfts),
                    "errors": sum(s.error is not None for s in group),
                    "ttft_p50": p50,
                    "ttft_p95": p95,
                    "ttft_p99": p99,
                    "tokens_per_s_mean": sum(speeds) / len(speeds) if speeds else None,
                    **_cost_per_1000(group),
                }
            )
    return rows


def _cost_per_1000(group: Sequence[Probe]) -> dict[str, Any]:
    """What 1,000 of the group's routed requests cost, on their mean (hedges, retries and
    continuations included; failed requests too, since their attempts were billed)."""
    routed = [s for s in group if s.route is not None]
    currencies = {s.currency for s in routed}
    if not routed or any(s.cost is None for s in routed) or len(currencies) != 1:
        return {"cost_per_1000": None, "currency": None}
    total = sum((Decimal(s.cost or 0) for s in routed), Decimal(0))
    return {"cost_per_1000": str(total * 1000 / len(routed)), "currency": currencies.pop()}


def _summary_table(summary: list[dict[str, Any]], *, routed: bool = False) -> Any:
    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    def money(row: dict[str, Any]) -> str:
        value = row.get("cost_per_1000")
        return "unknown" if value is None else f"{Decimal(value):.4f} {row['currency']}"

    if routed:
        return table(
            "Time to first token through the route, as the caller saw it",
            ["route", "length", "n", "errors", "p50", "p95", "p99", "tokens/s", "cost/1k"],
            [
                [
                    row["target"],
                    f"{row['length']} (~{LENGTHS[row['length']]} tok)",
                    row["ok"],
                    row["errors"],
                    ms(row["ttft_p50"]),
                    ms(row["ttft_p95"]),
                    ms(row["ttft_p99"]),
                    speed(row["tokens_per_s_mean"]),
                    money(row),
                ]
                for row in summary
            ],
        )
    return table(
        "Time to first token through the route, as the caller saw it"
        if routed
        else "Time to first token per target and prompt length (each target probed alone)",
        ["route" if routed else "target", "length", "n", "errors", "p50", "p95", "p99", "tokens/s"],
        [
            [
                row["target"],
                f"{row['length']} (~{LENGTHS[row['length']]} tok)",
                row["ok"],
                row["errors"],
                ms(row["ttft_p50"]),
                ms(row["ttft_p95"]),
                ms(row["ttft_p99"]),
                speed(row["tokens_per_s_mean"]),
            ]
            for row in summary
        ],
    )


def _served_table(samples: list[Probe], targets: list[str]) -> Any:
    """A routed run by the target that served each request: its share, hedges it won, its TTFT."""
    served: dict[str, list[Probe]] = {name: [] for name in targets}
    for sample in samples:
        if sample.route is not None and sample.error is None and sample.route["winner"]:
            served.setdefault(sample.route["winner"], []).append(sample)
    rows: list[list[Any]] = []
    for name, group in served.items():
        ttfts = [s.ttft for s in group if s.ttft is not None]
        p50, p95, _ = percentiles(ttfts)
        hedge_wins = sum(
            any(a["reason"] == "hedge" and a["outcome"] == "won" for a in s.route["attempts"])
            for s in group
            if s.route is not None
        )
        rows.append([name, len(group), hedge_wins, ms(p50), ms(p95)])
    failed = sum(s.error is not None for s in samples)
    hedged = sum(s.route is not None and s.route["hedges"] > 0 for s in samples)
    rows.append(["(failed)", failed, "", "", ""])
    return table(
        f"Who served the routed requests ({hedged} of {len(samples)} hedged)",
        ["served by", "requests", "hedges won", "p50", "p95"],
        rows,
    )


def _run_data(
    samples: list[Probe],
    summary: list[dict[str, Any]],
    endpoints: list[_Endpoint],
    lengths: list[str],
    args: argparse.Namespace,
    wall: float,
    route_targets: list[str] | None,
) -> dict[str, Any]:
    """The run as ``--json`` writes it (and as ``--plot`` and ``--replot`` draw it)."""
    rows: list[dict[str, Any]] = []
    for sample in sorted(samples, key=lambda s: s.started):
        row = dataclasses.asdict(sample)
        if row["route"] is None:
            del row["route"]  # a direct probe: the file stays as it was before --routed
        rows.append(row)
    return {
        "version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {
            "probes": args.probes,
            "concurrency": args.concurrency,
            "lengths": {name: LENGTHS[name] for name in lengths},
            "max_tokens": args.max_tokens,
            "nonce": args.nonce,
            "repeat": args.repeat,
            "simulator": args.simulator,
            "timeout": args.timeout,
            "routed": endpoints[0].target if route_targets is not None else None,
        },
        "targets": route_targets if route_targets is not None else [e.target for e in endpoints],
        "wall_seconds": wall,
        "summary": summary,
        "samples": rows,
    }


def _json_text(data: dict[str, Any], endpoints: list[_Endpoint]) -> str:
    return _scrub(json.dumps(data, indent=2), [s for e in endpoints for s in e.secrets])


def _write_json(path: Path, data: dict[str, Any], endpoints: list[_Endpoint]) -> None:
    path.write_text(_json_text(data, endpoints) + "\n", encoding="utf-8")


def _plot(path: Path, data: dict[str, Any], scale: str) -> None:
    """The picture of a run: per-target TTFT ECDFs, or a routed run over time."""
    from ._bench_plot import ecdf_figure, is_routed, routed_figure, save

    figure = routed_figure(data, scale) if is_routed(data) else ecdf_figure(data, scale)
    save(figure, path)
