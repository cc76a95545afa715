"""``llmroute demo``: simulated providers on loopback, no API keys."""

from __future__ import annotations

import argparse
import sys

import anyio

from ._format import ms as _ms

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="stream answers from simulated providers (no keys needed)"
    )
    demo.set_defaults(run=lambda args: anyio.run(_demo))


_PROMPTS = [
    "Explain HTTP/2 multiplexing in one sentence.",
    "Why does time to first token matter for chat apps?",
]


def _demo_profiles() -> dict[str, object]:
    from ..testing import Profile

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

    from .. import AsyncOpenAI, OpenAIError
    from ..testing import Simulator

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
