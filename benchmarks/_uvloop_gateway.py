"""``llmroute serve`` on uvloop's event loop (``benchmarks/gateway.py --servers
hypercorn-uvloop``, ``pip install uvloop``): the same command line, another asyncio loop."""

from __future__ import annotations

import asyncio
import sys

import uvloop

from llmroute.cli import main

if __name__ == "__main__":
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.exit(main())
