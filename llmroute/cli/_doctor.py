"""``llmroute doctor``: probe each routed target and say where its time to first token goes."""

from __future__ import annotations

import argparse
import sys

import anyio

from .._streaming import AsyncStream
from ._format import add_tls_options, tls_verify
from ._format import ms as _ms

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="probe each routed target and say where its time to first token goes",
        description=(
            "Probe every target of every route with a few streamed requests and say where its "
            "time to first token goes. Exits 1 when any target fails, naming which and why."
        ),
    )
    doctor.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    doctor.add_argument("--probes", type=int, default=5, help="streamed probes per target (5)")
    doctor.add_argument(
        "--timeout", type=float, default=30.0, help="seconds one probe may take (30)"
    )
    add_tls_options(doctor)
    doctor.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.probes < 1 or not args.timeout > 0:
        sys.stderr.write("llmroute doctor: --probes must be at least 1 and --timeout above 0\n")
        return 2
    try:
        verify = tls_verify(args, "llmroute doctor")
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return anyio.run(_doctor, args.config, args.probes, args.timeout, verify)


async def _doctor(config_path: str | None, probes: int, timeout: float, verify: bool | str) -> int:
    import statistics

    from .. import AsyncOpenAI, OpenAIError
    from .._config import ConfigError, load_config, resolve
    from ..routing.causes import classify
    from ..routing.stats import LiveStats
    from ..sglang import MetricsPoller, diagnose_ttft, suggest_preset
    from ._bench import _config_endpoints, _scrub

    try:
        config = load_config(config_path)
        if config is None:
            raise ConfigError("no config: pass --config or set LLMROUTE_CONFIG")
        resolved = resolve(config)
        endpoints = {e.target: e for e in _config_endpoints(config, verify)}
    except ConfigError as exc:
        sys.stderr.write(f"llmroute doctor: {exc}\n")
        return 2
    if not endpoints:
        sys.stderr.write(f"llmroute doctor: {config.source}: no routes, so no targets to probe\n")
        return 2
    write = sys.stdout.write
    write(f"{'target':40} {'client TTFT':>12} {'server TTFT':>12}  where the time goes\n")
    failed: list[str] = []
    for target in resolved.targets():
        provider = resolved.providers[target.provider]
        endpoint = endpoints[target.name]
        poller = None
        if provider.kind == "sglang":
            keys = {target.name: provider.api_key} if provider.api_key else None
            poller = MetricsPoller({target.name: str(provider.base_url)}, LiveStats(), keys=keys)
            await poller.poll_once()
        ttfts: list[float] = []
        itls: list[float] = []
        error = None
        async with AsyncOpenAI(**endpoint.client_args) as client:
            for index in range(probes):
                try:
                    with anyio.fail_after(timeout):
                        stream = await client.chat.completions.create(
                            model=endpoint.model,
                            messages=[{"role": "user", "content": f"Say hello ({index})."}],
                            max_tokens=8,
                            stream=True,
                        )
                        async with stream:
                            async for _ in stream:
                                pass
                    assert isinstance(stream, AsyncStream)  # llmroute's: it has timings
                    timings = stream.timings
                    if timings.first_token is not None:
                        ttfts.append(timings.first_token)
                        if timings.total is not None and timings.tokens > 1:
                            decode = timings.total - timings.first_token
                            itls.append(decode / (timings.tokens - 1))
                except TimeoutError:
                    error = f"Timeout: no complete answer within {timeout:g} s"
                    break
                except OpenAIError as exc:
                    message = _scrub(" ".join(str(exc).split()), endpoint.secrets)
                    error = f"{type(exc).__name__}: {message[:300]}"
                    if classify(exc) == "misconfigured":  # a wrong key, model or permission
                        error = f"misconfigured (check its key and model name): {error}"
                    break
        if error is None and not ttfts:
            error = "NoToken: the streams ended without a token"
        server = None
        if poller is not None:
            fresh = await poller.poll_once()
            server = fresh.get(target.name)
            await poller.aclose()
        client_ttft = statistics.median(ttfts) if ttfts else None
        diagnosis = diagnose_ttft(client_ttft, server)
        server_ttft = diagnosis.server_ttft
        verdict = error or diagnosis.verdict
        if error is not None:
            failed.append(f"{target.name} ({error})")
        write(f"{target.name:40} {_ms(client_ttft):>12} {_ms(server_ttft):>12}  {verdict}\n")
        itl = statistics.median(itls) if itls else None
        suggestion = None if error else suggest_preset(diagnosis, itl)
        if suggestion is not None and provider.kind == "sglang":
            write(f"{'':40} suggestion: {suggestion}\n")
    if failed:
        count = len(resolved.targets())
        sys.stderr.write(
            f"llmroute doctor: {len(failed)} of {count} targets failed: {'; '.join(failed)}\n"
        )
        return 1
    return 0
