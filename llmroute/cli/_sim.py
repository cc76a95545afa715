"""``llmroute sim``: simulated OpenAI-compatible providers on 127.0.0.1 until Ctrl-C.

Each ``--profile`` is one simulator (a preset's name or a JSON object of profile fields, with a
name of its own before ``=``); all of them share the process's one CA, whose file is printed
with their base URLs, so one ``verify`` (``--ca``, ``SSL_CERT_FILE``) trusts every one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from ._format import MissingExtra, require
from ._parser import examples, port

if TYPE_CHECKING:
    from ..testing import Profile, Simulator

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..testing import PRESETS

    sim = commands.add_parser(
        "sim",
        help="serve simulated providers on 127.0.0.1 (TLS + HTTP/2) until Ctrl-C",
        description=(
            "Serve simulated OpenAI-compatible providers on 127.0.0.1 and print each one's base "
            "URL and the CA file that trusts all of them. A config needs none of this: a "
            'provider with kind = "simulator" starts with its client (docs/simulator.md).'
        ),
        epilog=examples(
            "llmroute sim",
            "llmroute sim --profile fast=fast-but-spiky --profile slow=steady-slow",
            "llmroute sim --no-tls --port 9000 --json",
        ),
    )
    sim.add_argument(
        "--profile",
        action="append",
        metavar="[NAME=]PROFILE",
        help=(
            "one simulator per --profile: a preset ("
            + ", ".join(PRESETS)
            + ") or a JSON object of profile fields such as "
            '\'{"ttft_median": 0.2, "stall_prob": 0.1}\' (optionally on a preset: '
            '\'{"preset": "flaky", "rate_503": 0.2}\'); NAME= names it (default: the preset, or '
            "sim1, sim2, ...); default: one 'instant' simulator"
        ),
    )
    sim.add_argument(
        "--port",
        type=port,
        default=0,
        help="the first simulator's port (default 0: any free one; the others take any free one)",
    )
    sim.add_argument(
        "--no-tls",
        dest="tls",
        action="store_false",
        help="plain HTTP/1.1 instead of TLS with HTTP/2 (no CA to trust)",
    )
    sim.add_argument(
        "--seed", type=int, help="seed of every simulator's random draws (default: per name)"
    )
    sim.add_argument(
        "--json",
        action="store_true",
        help=(
            "print one JSON document instead: the simulators, each with its name, base_url, "
            "ca_pem_path and profile"
        ),
    )
    sim.set_defaults(run=_run)


def parse_profiles(given: list[str] | None, seed: int | None) -> dict[str, Profile]:
    """``--profile`` values by simulator name; a mistake is a ``ValueError`` naming it."""
    import dataclasses
    import zlib

    from ..testing import profile_of

    profiles: dict[str, Profile] = {}
    for index, text in enumerate(given or ["instant"], start=1):
        where = f"--profile {text!r}"
        name, spec = "", text.strip()
        if not spec.startswith("{") and "=" in spec:
            name, _, spec = (part.strip() for part in spec.partition("="))
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"{where}: a simulator's name (before '=') is one word")
        table: Any = spec
        if spec.startswith("{"):
            try:
                table = json.loads(spec)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON object ({exc})") from None
        profile = profile_of(table, where)
        name = name or (spec if isinstance(table, str) else f"sim{index}")
        if name in profiles:
            raise ValueError(f"{where}: two simulators named {name!r}; name one NAME=PROFILE")
        if seed is not None:
            profile = dataclasses.replace(profile, seed=seed)
        elif not (isinstance(table, dict) and "seed" in table):
            profile = dataclasses.replace(profile, seed=zlib.crc32(name.encode()))
        profiles[name] = profile
    return profiles


def _run(args: argparse.Namespace) -> int:
    try:
        require("hypercorn", "testing")
        require("trustme", "testing")
    except MissingExtra as exc:
        sys.stderr.write(f"llmroute sim: {exc}\n")
        return 2
    try:
        profiles = parse_profiles(args.profile, args.seed)
    except ValueError as exc:
        sys.stderr.write(f"llmroute sim: {exc}\n")
        return 2
    from ..testing import Simulator

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _SIGNALS}
    sims: dict[str, Simulator] = {}
    try:
        for index, (name, profile) in enumerate(profiles.items()):
            port = args.port if index == 0 else 0
            try:
                sims[name] = Simulator(profile=profile, tls=args.tls, port=port).start()
            except OSError as exc:
                sys.stderr.write(f"llmroute sim: cannot listen on 127.0.0.1:{port}: {exc}\n")
                return 1
        sys.stdout.write(_announce(sims, args.json))
        sys.stdout.flush()
        while not stop.wait(1.0):  # until Ctrl-C or SIGTERM (a signal ends the wait at once)
            pass
    finally:
        for sim in sims.values():
            sim.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not args.json:
        sys.stdout.write("llmroute sim: stopped\n")
    return 0


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _announce(sims: dict[str, Simulator], as_json: bool) -> str:
    """The simulators' addresses, the CA that trusts them all, and how to use them."""
    first = next(iter(sims.values()))
    ca = first.ca_pem_path if first.tls else None
    if as_json:  # one document, on one line, as soon as they listen
        simulators = [
            {
                "name": name,
                "base_url": sim.base_url,
                "ca_pem_path": ca,
                "profile": sim.profile.to_dict(),
            }
            for name, sim in sims.items()
        ]
        return json.dumps({"simulators": simulators}) + "\n"
    wire = "TLS + HTTP/2" if first.tls else "plain HTTP/1.1"
    width = max(len(name) for name in sims)
    lines = [f"llmroute sim: {len(sims)} simulated provider(s) on 127.0.0.1 ({wire}):"]
    lines += [f"  {name:{width}}  {sim.base_url}" for name, sim in sims.items()]
    models = ", ".join(first.profile.models)
    lines.append(f"models: {models} (and any other name a request gives); any API key")
    url = first.base_url
    body = '{"model": "sim-small", "messages": [{"role": "user", "content": "Hello!"}]}'
    cacert = ""
    if ca is not None:
        lines.append(f"CA:   {ca}")
        lines.append(
            "      one CA for all of them: verify = that path in a provider's table, --ca for "
            "llmroute's commands, SSL_CERT_FILE for openai's own client"
        )
        cacert = f"--cacert {shlex.quote(ca)} "
    lines.append(
        f"try:  curl -s {cacert}{url}/chat/completions -H 'Authorization: Bearer any' "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
    lines.append("Ctrl-C stops them.")
    return "\n".join(lines) + "\n"
