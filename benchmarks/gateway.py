"""Gateway benchmark: the TTFT the gateway adds, through it vs directly to the same simulator.

One zero-latency simulator in its own process (``SimulatorProcess``, TLS + HTTP/2, ``Profile()``
defaults but ``--tokens`` per reply). One gateway in its own process (``llmroute serve`` with a
trustme certificate: HTTPS, HTTP/2 by ALPN; with ``--plain`` plain HTTP/1.1), one route ``chat``
-> the simulator, no cache. The benchmark's client is ``llmroute.AsyncOpenAI`` for both paths
(HTTP/2 over TLS to each server, or HTTP/1.1 keep-alive to a ``--plain`` gateway):

- direct:  ``base_url`` = the simulator, ``model="sim-small"``
- gateway: ``base_url`` = the gateway, ``model="chat"`` (the gateway's own llmroute client then
  goes to the simulator over a warm HTTP/2 connection)

TTFT is from ``create()`` to the first chunk with content; every stream is read to its end. At
each concurrency (1 and 64) the two paths alternate in batches, in rotated order each round, so
both see the same machine state; percentiles are nearest-rank over all requests of a path. The
gateway process's CPU time (``/proc``) over its batches, per request, is reported too (on a
shared machine it moves far less than latencies do), beside the simulator's over the direct
batches: what one hypercorn server spends to stream the same reply, and this process's over
the direct batches: what llmroute's client spends to read it.

    .venv/bin/python benchmarks/gateway.py            # about a minute
    .venv/bin/python benchmarks/gateway.py --plain    # client -> gateway over HTTP/1.1
    .venv/bin/python benchmarks/gateway.py --quick    # smoke run
    .venv/bin/python benchmarks/gateway.py --baseline /tmp/base --no-litellm   # before/after

``--baseline DIR`` runs that tree's ``llmroute serve`` too (path ``gateway-baseline``), in the
same rotation; below the table, the ratio of the two gateways' CPU per request, the median of
the per-round ratios with their range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import trustme
from _machine import machine
from _trees import ratio

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, SimulatorProcess

UPSTREAM_KEY = "sk-bench-gateway-upstream"
GATEWAY_KEY = "gw-bench-gateway-key"
MESSAGES: Any = [{"role": "user", "content": "How much does a gateway add?"}]
ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process and its children (``--workers``) have used so far,
    from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        total += sum(cpu_seconds(int(child)) for child in children.read_text().split())
    return total


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def gateway_files(
    sim: SimulatorProcess, folder: str, gateway: str = ""
) -> tuple[trustme.CA, str, str, str]:
    """A gateway's files in ``folder``: its CA, certificate, key and config (one route ``chat``
    -> the simulator, the key ``bench`` from ``$BENCH_GATEWAY_KEY``, ``gateway``: more lines of
    its ``[gateway]`` table)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    leaf.private_key_and_cert_chain_pem.write_to_path(cert)
    leaf.private_key_pem.write_to_path(key)
    config = os.path.join(folder, "llmroute.toml")
    Path(config).write_text(
        f'[providers.sim]\nbase_url = "{sim.base_url}"\napi_key_env = "BENCH_UPSTREAM_KEY"\n\n'
        '[models.chat]\ntargets = ["sim:sim-small"]\n\n'
        '[gateway]\nkeys = { bench = "BENCH_GATEWAY_KEY" }\nport = 0\n'
        "max_concurrency_per_key = 1000\n" + gateway
    )
    return ca, cert, key, config


@contextmanager
def gateway_process(
    sim: SimulatorProcess,
    folder: str,
    *,
    tls: bool = True,
    gateway: str = "",
    workers: int = 1,
    server: str = "hypercorn",
    source: str | None = None,
) -> Iterator[tuple[str, ssl.SSLContext, int]]:
    """``llmroute serve`` (``server="hypercorn"``) or granian serving the same ``GatewayApp``
    in a child process, over HTTPS unless ``tls`` is false (then plain HTTP/1.1); yields its
    base URL, a client context trusting its certificate and its pid. ``gateway``: more lines
    of its ``[gateway]`` table. ``source``: another checkout of llmroute to run the gateway
    from (an A/B in one run), with this environment's packages."""
    folder = tempfile.mkdtemp(dir=folder, prefix=f"{server}-")
    ca, cert, key, config = gateway_files(sim, folder, gateway)
    env = {
        **os.environ,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "BENCH_GATEWAY_KEY": GATEWAY_KEY,
        "SSL_CERT_FILE": sim.ca_pem_path or "",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [source or str(ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if server == "granian":
        with granian_process(config, cert, key, env, tls=tls, workers=workers) as (url, pid):
            yield url, ctx, pid
        return
    command = [sys.executable, "-m", "llmroute.cli", "serve", "--config", config]
    if server == "hypercorn-uvloop":  # the same command on uvloop's event loop
        command += ["--loop", "uvloop"]
    command += ["--log-level", "warning", "--workers", str(workers)]
    if tls:
        command += ["--certfile", cert, "--keyfile", key]
    with child(command, stdout=subprocess.PIPE, text=True, env=env, cwd=source) as proc:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if readable else ""
        if "listening on " not in line:
            raise RuntimeError(f"the gateway did not start: {line!r}")
        yield line.split("listening on ", 1)[1].split()[0], ctx, proc.pid


@contextmanager
def child(command: list[str], **options: Any) -> Iterator[subprocess.Popen[Any]]:
    """A child process (``options`` for ``Popen``), terminated when the block ends (killed
    if it has not exited 15 s later)."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, **options)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(
    proc: subprocess.Popen[Any], name: str, ready: Callable[[], bool], seconds: float
) -> None:
    """Poll ``ready()`` (an ``OSError`` counts as not ready) until it holds; ``RuntimeError``
    if ``proc`` exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer within {seconds:g} s")
        time.sleep(0.3)


@contextmanager
def granian_process(
    config: str, cert: str, key: str, env: dict[str, str], *, tls: bool, workers: int
) -> Iterator[tuple[str, int]]:
    """granian (Rust, hyper) serving ``GatewayApp(config)`` (benchmarks/_granian_gateway.py):
    HTTP/2 over TLS, or HTTP/1.1 without ``tls``; yields its base URL and pid."""
    from cryptography.hazmat.primitives import serialization

    port = _free_port()
    pkcs8 = key + ".pkcs8"  # granian reads PKCS#8 keys only
    loaded = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    Path(pkcs8).write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    command = [sys.executable, "-m", "granian", "--interface", "asgi", "--no-ws"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    command += ["--log-level", "warning", "--http", "2" if tls else "1"]
    command += ["--working-dir", str(Path(__file__).resolve().parent)]
    if tls:
        command += ["--ssl-certificate", cert, "--ssl-keyfile", pkcs8]
    command += ["--factory", "_granian_gateway:app"]
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    options: dict[str, Any] = {"stdout": subprocess.DEVNULL, "start_new_session": True}
    with child(command, env={**env, "LLMROUTE_CONFIG": config}, **options) as proc:
        wait_ready(proc, "granian", listening, 60)
        yield url + "/v1", proc.pid


LITELLM_KEY = "sk-bench-litellm-master"
LITELLM_ENV = ROOT / ".venv-litellm"


def litellm_python(given: str | None) -> Path | None:
    """The Python of the benchmark-only environment holding ``litellm[proxy]``: ``--litellm``,
    else ``$LLMROUTE_BENCH_LITELLM``, else ``.venv-litellm`` (``make bench-litellm-env``)."""
    for candidate in (given, os.environ.get("LLMROUTE_BENCH_LITELLM")):
        if candidate:
            return Path(candidate)
    default = LITELLM_ENV / "bin" / "python"
    return default if default.exists() else None


@contextmanager
def litellm_process(sim: SimulatorProcess, folder: str, python: Path) -> Iterator[tuple[str, int]]:
    """LiteLLM's proxy (uvicorn, plain HTTP/1.1) with one model ``chat`` -> the simulator;
    yields its base URL and pid."""
    port = _free_port()
    config = os.path.join(folder, "litellm.yaml")
    Path(config).write_text(
        "model_list:\n"
        "  - model_name: chat\n"
        "    litellm_params:\n"
        "      model: openai/sim-small\n"
        f"      api_base: {sim.base_url}\n"
        "      api_key: os.environ/BENCH_UPSTREAM_KEY\n"
        "general_settings:\n"
        "  master_key: os.environ/BENCH_LITELLM_KEY\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  turn_off_message_logging: true\n"
    )
    env = {
        **os.environ,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "BENCH_LITELLM_KEY": LITELLM_KEY,
        "SSL_CERT_FILE": sim.ca_pem_path or "",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no price map download at import
        "LITELLM_LOG": "ERROR",
    }
    script = python.parent / "litellm"
    command = [str(script), "--config", config, "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"

    def live() -> bool:
        with urllib.request.urlopen(url + "/health/liveliness", timeout=2) as reply:
            return reply.status == 200

    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with child(command, env=env, **quiet) as proc:
        wait_ready(proc, "LiteLLM's proxy", live, 180)
        yield url + "/v1", proc.pid


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def ttft(client: AsyncOpenAI, model: str) -> float:
    """Seconds from create() to the first chunk with content; the stream is read to its end."""
    started = time.perf_counter()
    stream = await client.chat.completions.create(model=model, messages=MESSAGES, stream=True)
    first = math.nan
    async with stream:
        async for chunk in stream:
            if math.isnan(first) and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
    return first


async def batch(client: AsyncOpenAI, model: str, requests: int, concurrency: int) -> list[float]:
    """``requests`` streams, ``concurrency`` at a time (each worker one after another)."""
    out: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            out.append(await ttft(client, model))

    share, extra = divmod(requests, concurrency)
    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
    return out


async def measure(
    sim: SimulatorProcess,
    gateways: dict[str, tuple[str, ssl.SSLContext, int]],
    levels: Sequence[int],
    rounds: int,
    per_batch: dict[int, int],
    litellm: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Each path's TTFTs and CPU per request at each level: ``direct`` to the simulator, each
    of ``gateways`` (name -> base URL, TLS context, pid) and LiteLLM's proxy if given."""
    direct = AsyncOpenAI(api_key=UPSTREAM_KEY, base_url=sim.base_url, verify=sim.ssl_context())
    paths = {"direct": (direct, "sim-small")}
    pids: dict[str, int] = {}
    for name, (url, ctx, pid) in gateways.items():
        paths[name] = (AsyncOpenAI(api_key=GATEWAY_KEY, base_url=url, verify=ctx), "chat")
        pids[name] = pid
    if litellm is not None:
        paths["litellm"] = (AsyncOpenAI(api_key=LITELLM_KEY, base_url=litellm[0]), "chat")
        pids["litellm"] = litellm[1]
    results: dict[str, Any] = {}
    try:
        for client, model in paths.values():
            await batch(client, model, 64, 16)  # warm both paths' connections and pools
        for level in levels:
            samples: dict[str, list[float]] = {name: [] for name in paths}
            # Each proxy's CPU seconds during its own batches; the simulator's during the
            # direct batches (a hypercorn baseline).
            cpu = {name: 0.0 for name in pids}
            cpu_rounds: dict[str, list[float]] = {name: [] for name in pids}
            sim_cpu = client_cpu = 0.0
            for round_ in range(rounds):
                names = list(paths)
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                for name in order:
                    client, model = paths[name]
                    pid = pids.get(name)
                    before = cpu_seconds(pid) if pid else 0.0
                    sim_before = cpu_seconds(sim.pid or 0)
                    client_before = time.process_time()
                    samples[name] += await batch(client, model, per_batch[level], level)
                    if pid:
                        cpu[name] += cpu_seconds(pid) - before
                        cpu_rounds[name].append((cpu_seconds(pid) - before) / per_batch[level])
                    else:
                        sim_cpu += cpu_seconds(sim.pid or 0) - sim_before
                        client_cpu += time.process_time() - client_before
            row: dict[str, Any] = {"n": {k: len(v) for k, v in samples.items()}}
            for name, seconds in cpu.items():
                row[f"{name}_cpu_per_request"] = seconds / max(1, len(samples[name]))
                row[f"{name}_cpu_per_request_rounds"] = cpu_rounds[name]
            row["simulator_cpu_per_request"] = sim_cpu / max(1, len(samples["direct"]))
            # This process over the direct batches: llmroute's client streaming the same reply
            # from the simulator, the other half of the work a gateway does per request.
            row["client_cpu_per_request"] = client_cpu / max(1, len(samples["direct"]))
            for name, values in samples.items():
                row[name] = {"p50": pct(values, 0.5), "p99": pct(values, 0.99)}
            results[str(level)] = row
    finally:
        for client, _ in paths.values():
            await client.close()
    return results


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    """One row per concurrency and proxy: its TTFT beside the direct path's, and its CPU per
    request beside the simulator's (a bare hypercorn server streaming the same reply). "client's":
    this process's CPU per direct request (llmroute's client streaming the same reply);
    "floor ratio": (simulator's + client's) / simulator's, what a proxy made of that server and
    that client would spend with no work of its own."""
    lines = [
        "| concurrency | path | requests | direct p50 | p50 | added p50 | ratio p50 "
        "| direct p99 | p99 | added p99 | CPU per request | simulator's | CPU ratio "
        "| client's | floor ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    for level, row in results.items():
        d = row["direct"]
        for name in row["n"]:
            if name == "direct":
                continue
            g = row[name]
            cpu, sim = row[f"{name}_cpu_per_request"], row["simulator_cpu_per_request"]
            cells = [level, name, str(row["n"][name])]
            cells += [f"{d['p50'] * 1000:.2f} ms", f"{g['p50'] * 1000:.2f} ms"]
            cells += [f"**{(g['p50'] - d['p50']) * 1000:+.2f} ms**", f"{g['p50'] / d['p50']:.2f}x"]
            cells += [f"{d['p99'] * 1000:.2f} ms", f"{g['p99'] * 1000:.2f} ms"]
            cells += [f"**{(g['p99'] - d['p99']) * 1000:+.2f} ms**"]
            cells += [f"{cpu * 1000:.2f} ms", f"{sim * 1000:.2f} ms", f"{cpu / sim:.2f}x"]
            own = row["client_cpu_per_request"]
            cells += [f"{own * 1000:.2f} ms", f"{(sim + own) / sim:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + baseline_ratios(results))


def baseline_ratios(results: dict[str, Any]) -> list[str]:
    """With ``--baseline``: the gateway's CPU per request over the baseline's, the median of
    the per-round ratios (their batches run back to back each round) and their range."""
    lines = []
    for level, row in results.items():
        this = row.get("gateway_cpu_per_request_rounds")
        base = row.get("gateway-baseline_cpu_per_request_rounds")
        if not this or not base:
            continue
        r = ratio(this, base)
        lines.append(
            f"gateway CPU per request / gateway-baseline's at concurrency {level}: "
            f"{r['median']:.3f} (rounds {r['min']:.3f}..{r['max']:.3f}; "
            f"{row['gateway_cpu_per_request'] * 1000:.3f} ms vs "
            f"{row['gateway-baseline_cpu_per_request'] * 1000:.3f} ms)"
        )
    return ["", *lines] if lines else []


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=20, help="reply length (SSE chunks)")
    parser.add_argument("--per-batch-1", type=int, default=25, help="requests per batch at c=1")
    parser.add_argument("--per-batch-64", type=int, default=256, help="... at c=64")
    parser.add_argument("--quick", action="store_true", help="2 rounds of small batches")
    parser.add_argument(
        "--plain", action="store_true", help="the gateway over plain HTTP/1.1 (client side)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="gateway processes (llmroute serve --workers)"
    )
    parser.add_argument(
        "--litellm",
        help="the Python of an environment with litellm[proxy] (default: $LLMROUTE_BENCH_LITELLM,"
        " else .venv-litellm from 'make bench-litellm-env'); LiteLLM is skipped without one",
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument(
        "--servers",
        default="hypercorn",
        help="HTTP servers the gateway runs on, side by side: hypercorn (llmroute serve), "
        "granian (pip install granian), hypercorn-uvloop (llmroute serve --loop uvloop: pip "
        "install uvloop); comma-separated",
    )
    parser.add_argument(
        "--baseline",
        help="another llmroute checkout (e.g. from git archive) whose llmroute serve runs "
        "beside this one's as the path gateway-baseline: before and after in one run",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.per_batch_1, args.per_batch_64 = 2, 5, 64
    per_batch = {1: args.per_batch_1, 64: args.per_batch_64}
    python = None if args.no_litellm else litellm_python(args.litellm)
    if python is None and not args.no_litellm:
        print(
            "LiteLLM skipped: no environment with litellm[proxy] (make bench-litellm-env, or "
            "--litellm PYTHON)",
            file=sys.stderr,
        )
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as folder,
        SimulatorProcess(Profile(reply_tokens=args.tokens), tls=True) as sim,
        ExitStack() as stack,
    ):
        gateways = {
            ("gateway" if name == "hypercorn" else f"gateway-{name}"): stack.enter_context(
                gateway_process(sim, folder, tls=not args.plain, workers=args.workers, server=name)
            )
            for name in servers
        }
        if args.baseline:
            gateways["gateway-baseline"] = stack.enter_context(
                gateway_process(
                    sim, folder, tls=not args.plain, workers=args.workers, source=args.baseline
                )
            )
        litellm = None
        if python is not None:
            try:
                litellm = stack.enter_context(litellm_process(sim, folder, python))
            except (OSError, RuntimeError) as exc:
                print(f"LiteLLM skipped: {exc}", file=sys.stderr)
        results = asyncio.run(measure(sim, gateways, [1, 64], args.rounds, per_batch, litellm))
    info = machine(["openai", "httpx", "h2", "hypercorn", "granian", "anyio"])
    if args.json:
        print(json.dumps({"results": results, "machine": info, "args": vars(args)}, indent=2))
        return
    print(report(results, args))
    load = f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    print(f"\nload average (1 min): {load}; {versions}")
    print(
        f"\nnproc={info['nproc']} cpu={info['cpu']} python={info['python']} "
        f"rounds={args.rounds} tokens={args.tokens} "
        f"client->gateway: {'HTTP/1.1 plain' if args.plain else 'HTTP/2 over TLS'}; "
        f"gateway workers: {args.workers}; "
        f"per batch: c=1 {args.per_batch_1}, c=64 {args.per_batch_64}"
    )


if __name__ == "__main__":
    main()
