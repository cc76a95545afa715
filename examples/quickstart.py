"""Quickstart: stream an answer through llmroute from a local simulated provider (no API key)."""

import asyncio

from llmroute import AsyncOpenAI
from llmroute.testing import Simulator


async def main() -> None:
    with Simulator() as sim:  # an OpenAI-compatible server on 127.0.0.1, TLS + HTTP/2
        async with AsyncOpenAI(
            api_key="any-key", base_url=sim.base_url, verify=sim.ssl_context()
        ) as client:
            await client.warmup()  # open the HTTP/2 connection before the first request
            stream = await client.chat.completions.create(
                model="gpt-6-luna",
                messages=[{"role": "user", "content": "Hello!"}],
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices:
                    print(chunk.choices[0].delta.content or "", end="", flush=True)
            t = stream.timings
            print(f"\nTTFT {t.first_token * 1000:.1f} ms over {t.http_version}")


asyncio.run(main())
