"""The ``llmroute`` command line: ``demo``, ``cache stats|clear``, ``sglang launch``, ``doctor``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

__all__ = ["main"]

_PROMPTS = [
    "Explain HTTP/2 multiplexing in one sentence.",
    "Why does time to first token matter for chat apps?",
]


def _demo_profiles() -> dict[str, object]:
    from .testing import Profile

    return {
        "fast-but-spiky": Profile(
            ttft_median=0.08,
            ttft_sigma=0.3,
            stall_prob=0.25,
            stall_range=(0.5, 1.0),
            inter_token=0.015,
            reply_tokens=24,
            seed=1,
        ),
        "steady-slow": Profile(
            ttft_median=0.35, ttft_sigma=0.05, inter_token=0.03, reply_tokens=24, seed=2
        ),
        "flaky": Profile(
            ttft_median=0.12,
            ttft_sigma=0.2,
            inter_token=0.02,
            reply_tokens=24,
            rate_429=0.3,
            retry_after=0.05,
            seed=3,
        ),
    }


async def _demo(out: object = None) -> int:
    import contextlib

    from . import AsyncOpenAI, OpenAIError
    from .testing import Simulator

    write = sys.stdout.write
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(Simulator(profile=profile, tls=True))  # type: ignore[arg-type]
            for name, profile in _demo_profiles().items()
        }
        write(
            "llmroute demo: three simulated providers on 127.0.0.1 (TLS + HTTP/2), no API keys\n\n"
        )
        for name, sim in sims.items():
            async with AsyncOpenAI(
                api_key="demo-key", base_url=sim.base_url, verify=sim.ssl_context()
            ) as client:
                await client.warmup()
                for prompt in _PROMPTS:
                    write(f"[{name}] {prompt}\n  > ")
                    try:
                        stream = await client.chat.completions.create(
                            model="sim-small",
                            messages=[{"role": "user", "content": prompt}],
                            stream=True,
                        )
                        async with stream:
                            async for chunk in stream:
                                if chunk.choices and chunk.choices[0].delta.content:
                                    write(chunk.choices[0].delta.content)
                                    sys.stdout.flush()
                        t = stream.timings
                        write(
                            f"\n  {t.http_version}, connection "
                            f"{'reused' if t.connection_reused else 'new'}, "
                            f"headers {_ms(t.headers)}, first token {_ms(t.first_token)}, "
                            f"total {_ms(t.total)}, {t.tokens} tokens, "
                            f"{t.retries} retries\n\n"
                        )
                    except OpenAIError as exc:
                        write(f"\n  failed: {type(exc).__name__}: {exc}\n\n")
        write(
            "Routing across these providers (hedging on live P95 TTFT) comes with the routing "
            "work.\n"
        )
    return 0


async def _cache_command(action: str, config_path: str | None, as_json: bool) -> int:
    import json

    from ._config import CacheSettings, ConfigError, RedisSettings, load_config
    from .cache import CacheUnavailable, open_store

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 2
    settings = (config.cache if config is not None else None) or CacheSettings()
    redis = config.redis if config is not None else RedisSettings()
    if settings.backend in ("off", "memory"):
        sys.stdout.write(
            f"The cache backend is {settings.backend!r}: nothing is kept outside the app's "
            "own process.\n"
        )
        return 0
    try:
        store = open_store(settings, redis)
    except CacheUnavailable as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 1
    try:
        if action == "clear":
            removed = await store.clear()
            sys.stdout.write(f"Cleared the cache, {store.describe()}: {removed} entries.\n")
            return 0
        stats = await store.stats()
    except CacheUnavailable as exc:
        sys.stderr.write(f"llmroute cache: {exc}\n")
        return 1
    finally:
        await store.aclose()
    rate = stats.hit_rate
    if as_json:
        data = {
            "store": store.describe(),
            "entries": stats.entries,
            "bytes": stats.bytes,
            "hits": stats.hits,
            "misses": stats.misses,
            "hit_rate": rate,
        }
        sys.stdout.write(json.dumps(data) + "\n")
        return 0
    sys.stdout.write(
        f"{store.describe()}\n"
        f"  entries   {stats.entries}\n"
        f"  bytes     {stats.bytes}\n"
        f"  hits      {stats.hits}\n"
        f"  misses    {stats.misses}\n"
        f"  hit rate  {'-' if rate is None else f'{rate:.1%}'}\n"
    )
    return 0


async def _sglang_launch(args: argparse.Namespace, extra: list[str]) -> int:
    import os
    import shlex
    import signal

    from .sglang import SGLangError, SGLangServer

    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    server = SGLangServer(
        args.model_path,
        served_model_name=args.served_model_name,
        port=args.port,
        host=args.host,
        api_key=args.api_key or os.environ.get(args.api_key_env) or None,
        python=args.python,
        image=args.image,
        gpus=gpus,
        extra_args=extra,
        log_dir=args.log_dir,
        startup_timeout=args.startup_timeout,
        grace=args.grace,
    )
    if args.dry_run:
        for worker in range(len(server)):
            sys.stdout.write(shlex.join(server.command(worker)) + "\n")
        return 0
    status = 0
    # Signals are caught from before the start to after the stop: a SIGTERM or SIGHUP (a closed
    # terminal) at any moment stops the servers, and a second one cannot cut the drain short.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(stop_on_signal)
            try:
                await server.start()
                key_file = server.log_dir / "api_key"
                fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(server.api_key + "\n")
                config = _launched_config(server, args.provider, args.api_key_env, key_file)
                sys.stdout.write(config)
                sys.stdout.flush()
                worker, code = await server.wait_exited()
                tail = "\n".join(server.log_tail(worker))
                sys.stderr.write(
                    f"llmroute sglang launch: server {worker} exited with status {code}; "
                    f"the end of its log:\n{tail}\n"
                )
                status = 1
            except SGLangError as exc:
                sys.stderr.write(f"llmroute sglang launch: {exc}\n")
                status = 1
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await server.stop()
    sys.stdout.write("SGLang stopped.\n")
    return status


def _launched_config(server: object, provider: str, key_env: str, key_file: object) -> str:
    from .sglang import SGLangServer

    assert isinstance(server, SGLangServer)
    lines = [
        f"# SGLang {server.version or ''} is ready: {len(server)} server(s) of "
        f"{server.served_model_name}; logs in {server.log_dir}",
        f"# The API key is in {key_file} (mode 0600): export {key_env}=$(cat {key_file})",
        "# Route to it with this config (Ctrl-C stops the servers):",
        "",
    ]
    for name, table in server.providers(provider).items():
        lines += [
            f"[providers.{name}]",
            'kind = "sglang"',
            f'base_url = "{table["base_url"]}"',
            f'api_key_env = "{key_env}"',
            "",
        ]
    targets = ", ".join(f'"{t}"' for t in server.targets(provider))
    lines += ["[models.chat]", f"targets = [{targets}]", 'policy = "prefix"', ""]
    return "\n".join(lines) + "\n"


async def _doctor(config_path: str | None, probes: int) -> int:
    import statistics

    from . import AsyncOpenAI, OpenAIError
    from ._config import ConfigError, load_config, resolve
    from .routing.stats import LiveStats
    from .sglang import MetricsPoller, diagnose_ttft

    try:
        config = load_config(config_path)
        if config is None:
            raise ConfigError("no config: pass --config or set LLMROUTE_CONFIG")
        resolved = resolve(config)
    except ConfigError as exc:
        sys.stderr.write(f"llmroute doctor: {exc}\n")
        return 2
    write = sys.stdout.write
    write(f"{'target':40} {'client TTFT':>12} {'server TTFT':>12}  where the time goes\n")
    seen: set[str] = set()
    for targets in resolved.routes.values():
        for target in targets:
            if target.name in seen:
                continue
            seen.add(target.name)
            provider = resolved.providers[target.provider]
            poller = None
            if provider.kind == "sglang":
                keys = {target.name: provider.api_key} if provider.api_key else None
                poller = MetricsPoller(
                    {target.name: str(provider.base_url)}, LiveStats(), keys=keys
                )
                await poller.poll_once()
            ttfts: list[float] = []
            error = None
            async with AsyncOpenAI(
                api_key=provider.api_key or "none", base_url=provider.base_url
            ) as client:
                for index in range(probes):
                    try:
                        stream = await client.chat.completions.create(
                            model=target.model,
                            messages=[{"role": "user", "content": f"Say hello ({index})."}],
                            max_tokens=8,
                            stream=True,
                        )
                        async with stream:
                            async for _ in stream:
                                pass
                        if stream.timings.first_token is not None:
                            ttfts.append(stream.timings.first_token)
                    except OpenAIError as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        break
            server = None
            if poller is not None:
                fresh = await poller.poll_once()
                server = fresh.get(target.name)
                await poller.aclose()
            client_ttft = statistics.median(ttfts) if ttfts else None
            diagnosis = diagnose_ttft(client_ttft, server)
            server_ttft = diagnosis.server_ttft
            verdict = error or diagnosis.verdict
            write(f"{target.name:40} {_ms(client_ttft):>12} {_ms(server_ttft):>12}  {verdict}\n")
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmroute", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="stream answers from simulated providers (no keys needed)")
    cache = commands.add_parser("cache", help="the response cache: its stats, or clear it")
    cache.add_argument("action", choices=["stats", "clear"])
    cache.add_argument(
        "--config", help="a TOML config (default: $LLMROUTE_CONFIG, else the default cache)"
    )
    cache.add_argument("--json", action="store_true", help="stats as one JSON object")
    sglang = commands.add_parser("sglang", help="self-hosted SGLang servers")
    sglang_commands = sglang.add_subparsers(dest="sglang_command", required=True)
    launch = sglang_commands.add_parser(
        "launch",
        help="start SGLang servers tuned for TTFT and wait until they are ready",
        description="Arguments after -- go to SGLang as they are and win over llmroute's.",
    )
    launch.add_argument("model_path", help="a Hugging Face model id or a local path")
    launch.add_argument("--gpus", help="one server per GPU, e.g. 0,1,2,3")
    launch.add_argument("--port", type=int, help="the first server's port (default: free ports)")
    launch.add_argument("--host", default="127.0.0.1")
    launch.add_argument("--served-model-name")
    launch.add_argument("--api-key", help="default: $SGLANG_API_KEY, else a random key")
    launch.add_argument("--api-key-env", default="SGLANG_API_KEY")
    launch.add_argument("--python", default=sys.executable, help="the interpreter with sglang")
    launch.add_argument("--image", help="run in this container image (docker run --gpus ...)")
    launch.add_argument("--log-dir")
    launch.add_argument("--startup-timeout", type=float, default=600.0)
    launch.add_argument("--grace", type=float, default=30.0, help="drain after SIGTERM (30 s)")
    launch.add_argument("--provider", default="gpu", help="provider name in the printed config")
    launch.add_argument("--dry-run", action="store_true", help="print the commands, start none")
    doctor = commands.add_parser(
        "doctor", help="probe each routed target and say where its time to first token goes"
    )
    doctor.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    doctor.add_argument("--probes", type=int, default=5, help="streamed probes per target (5)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if extra and args.command != "sglang":
        parser.error("arguments after -- are for llmroute sglang launch")
    if args.command == "demo":
        return anyio.run(_demo)
    if args.command == "cache":
        return anyio.run(_cache_command, args.action, args.config, args.json)
    if args.command == "sglang":
        try:
            return anyio.run(_sglang_launch, args, extra)
        except KeyboardInterrupt:  # asyncio's runner turns Ctrl-C into this, after the stop
            sys.stdout.write("SGLang stopped.\n")
            return 0
    if args.command == "doctor":
        return anyio.run(_doctor, args.config, args.probes)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
