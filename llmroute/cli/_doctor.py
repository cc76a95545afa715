"""``llmroute doctor``: probe each routed target and say where its time to first token goes."""

from __future__ import annotations

import argparse
import sys

import anyio

from .._streaming import AsyncStream
from ._format import ms as _ms

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor", help="probe each routed target and say where its time to first token goes"
    )
    doctor.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    doctor.add_argument("--probes", type=int, default=5, help="streamed probes per target (5)")
    doctor.set_defaults(run=lambda args: anyio.run(_doctor, args.config, args.probes))


async def _doctor(config_path: str | None, probes: int) -> int:
    import statistics

    from .. import AsyncOpenAI, OpenAIError
    from .._config import ConfigError, load_config, resolve
    from ..routing.causes import classify
    from ..routing.stats import LiveStats
    from ..sglang import MetricsPoller, diagnose_ttft

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
    for target in resolved.targets():
        provider = resolved.providers[target.provider]
        poller = None
        if provider.kind == "sglang":
            keys = {target.name: provider.api_key} if provider.api_key else None
            poller = MetricsPoller({target.name: str(provider.base_url)}, LiveStats(), keys=keys)
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
                    assert isinstance(stream, AsyncStream)  # llmroute's: it has timings
                    if stream.timings.first_token is not None:
                        ttfts.append(stream.timings.first_token)
                except OpenAIError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if classify(exc) == "misconfigured":  # a wrong key, model or permission
                        error = f"misconfigured (check its key and model name): {error}"
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
