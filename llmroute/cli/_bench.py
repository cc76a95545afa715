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
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from ._bench_plot import HEAVY_TAIL, SCALES
from ._bench_probe import LENGTHS, Probe, _Endpoint, _probe, _warm, prompt_for
from ._bench_report import (
    _json_text,
    _plot,
    _run_data,
    _saved_run_problem,
    _served_table,
    _summary_table,
    _write_json,
    summarize,
)
from ._bench_targets import _config_endpoints, _missing, _routed_endpoint, _select
from ._format import (
    MissingExtra,
    add_tls_options,
    check_output_path,
    check_plot_path,
    make_console,
    progress_bar,
    require,
    tls_verify,
)
from ._parser import examples

if TYPE_CHECKING:
    from rich.console import Console

    from .. import AsyncOpenAI
    from .._simulated import SimulatedProviders
    from ..config import Config

__all__ = ["LENGTHS", "Probe", "prompt_for", "register", "summarize"]


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
    _add_probe_options(parser)
    _add_output_options(parser)
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


def _add_probe_options(parser: argparse.ArgumentParser) -> None:
    """How many probes, how many at once, of which lengths, how long each may take."""
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


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """Where the run goes besides the tables: ``--json``, ``--plot``."""
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
        from ._demo_setup import SIM_MODEL, _demo_profiles

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
                from ._demo_setup import ROUTE, simulated_setup

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
    plan, fresh = _plan(endpoints, lengths, args)
    _announce(console, endpoints, lengths, args, source, route_targets, fresh)
    began = time.perf_counter()
    samples = await _probe_all(console, endpoints, plan, fresh, args, began)
    wall = time.perf_counter() - began
    summary = summarize(samples, [e.target for e in endpoints], lengths)
    console.print(_summary_table(summary, routed=route_targets is not None))
    if route_targets is not None:
        console.print(_served_table(samples, route_targets))
    _print_failures(console, samples)
    console.print(f"{len(samples)} probes in {wall:.1f} s")
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
        return 1
    return 0


def _plan(
    endpoints: list[_Endpoint], lengths: list[str], args: argparse.Namespace
) -> tuple[list[tuple[_Endpoint, str, int]], list[bool]]:
    """The probes in the order they are sent, and for each whether it gets a nonce."""
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
    return plan, fresh


def _announce(
    console: Console,
    endpoints: list[_Endpoint],
    lengths: list[str],
    args: argparse.Namespace,
    source: str,
    route_targets: list[str] | None,
    fresh: list[bool],
) -> None:
    """The run's first line: what is probed, from where, how."""
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


async def _probe_all(
    console: Console,
    endpoints: list[_Endpoint],
    plan: list[tuple[_Endpoint, str, int]],
    fresh: list[bool],
    args: argparse.Namespace,
    began: float,
) -> list[Probe]:
    """Send the ``plan``'s probes, ``--concurrency`` at a time, each endpoint's client warmed
    first; a progress bar on a terminal, a line every quarter elsewhere."""
    from contextlib import AsyncExitStack

    from .. import AsyncOpenAI

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
    return samples


def _print_failures(console: Console, samples: list[Probe]) -> None:
    """How many probes failed, and the first few distinct causes (per target)."""
    errors = [s for s in samples if s.error is not None]
    if not errors:
        return
    console.print(f"{len(errors)} of {len(samples)} probes failed; first causes:")
    seen: set[tuple[str, str]] = set()
    for sample in errors:
        cause = sample.error or ""
        if (sample.target, cause[:60]) in seen or len(seen) >= 6:
            continue
        seen.add((sample.target, cause[:60]))
        console.print(f"  {sample.target}: {cause[:160]}")
