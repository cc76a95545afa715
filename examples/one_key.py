"""Routing with one vendor key: two of OpenAI's models behind the name "chat" (README).

Run with OPENAI_API_KEY set: python examples/one_key.py llmroute.toml
"""

import asyncio
import sys

from llmroute import AsyncOpenAI


async def main(config: str) -> None:
    async with AsyncOpenAI(config=config) as client:
        for question in ("Hello!", "Name a prime number.", "Say goodbye."):
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": question}], stream=True
            )
            async for chunk in stream:
                if chunk.choices:
                    print(chunk.choices[0].delta.content or "", end="")
            route = stream.route  # winner, every attempt (target, start, outcome, TTFT, cost)
            print(f"\n  -> {route.winner}, first token after {route.ttft * 1000:.0f} ms")
        print(client.stats())  # per target: TTFT p50/p95/p99, inter-token latency, errors


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "llmroute.toml"))
