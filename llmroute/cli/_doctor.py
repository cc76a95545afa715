"""``llmroute doctor``: probe each routed target and say where its time to first token goes;
then, per catalog vendor, when the catalog's facts were checked and what the vendor's own
``/models`` says of the configured models."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._streaming import AsyncStream
from ._format import add_tls_options, error_text, tls_verify
from ._format import ms as _ms
from ._parser import examples

if TYPE_CHECKING:
    from .._catalog import ProviderSpec
    from ..config import Config, Resolved, ResolvedProvider
    from ._bench_probe import _Endpoint

__all__ = ["STALE_AFTER_DAYS", "checked_line", "models_lines", "register", "retired_lines"]

STALE_AFTER_DAYS = 180
"""Catalog facts checked longer ago than this are called possibly out of date."""
NEWER_SHOWN = 10
"""The newer models named at most (sorted); the rest are counted."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="probe each routed target and say where its time to first token goes",
        epilog=examples(
            "llmroute doctor --config llmroute.toml",
            "llmroute doctor --config llmroute.toml --probes 2 --ca ca.pem",
            "llmroute doctor --json",
        ),
        description=(
            "Probe every target of every route with a few streamed requests and say where its "
            "time to first token goes; then, per catalog vendor, when the catalog's facts were "
            "checked and, with its key, which configured models the vendor's /models no longer "
            "lists and which newer ones it offers. Exits 1 when any target fails, naming which "
            "and why."
        ),
    )
    doctor.add_argument("--config", help="a TOML config (default: $LLMROUTE_CONFIG)")
    doctor.add_argument("--probes", type=int, default=5, help="streamed probes per target (5)")
    doctor.add_argument(
        "--timeout", type=float, default=30.0, help="seconds one probe may take (30)"
    )
    doctor.add_argument(
        "--json",
        action="store_true",
        help="print the findings as one JSON document on stdout (failures still on stderr)",
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
    return anyio.run(_doctor, args.config, args.probes, args.timeout, verify, args.json)


async def _doctor(
    config_path: str | None, probes: int, timeout: float, verify: bool | str, as_json: bool = False
) -> int:
    from .._simulated import SimulatedProviders
    from ..config import ConfigError, load_config, resolve
    from ._bench_targets import _config_endpoints

    try:
        config = load_config(config_path)
        if config is None:
            raise ConfigError("no config: pass --config or set LLMROUTE_CONFIG")
        simulated = SimulatedProviders(config)  # the config's simulated providers, if any
    except ConfigError as exc:
        sys.stderr.write(f"llmroute doctor: {exc}\n")
        return 2
    try:
        resolved = resolve(config, simulated=simulated.addresses)
        endpoints = {e.target: e for e in _config_endpoints(config, verify, simulated.addresses)}
    except ConfigError as exc:
        sys.stderr.write(f"llmroute doctor: {exc}\n")
        await anyio.to_thread.run_sync(simulated.stop)
        return 2
    try:
        return await _report(config, resolved, endpoints, probes, timeout, verify, as_json)
    finally:
        await anyio.to_thread.run_sync(simulated.stop)


async def _report(
    config: Config,
    resolved: Resolved,
    endpoints: dict[str, _Endpoint],
    probes: int,
    timeout: float,
    verify: bool | str,
    as_json: bool = False,
) -> int:
    """Each target probed, and the catalog's report (as one JSON document with ``as_json``);
    1 when a target failed."""
    import statistics

    from ..routing.stats import LiveStats
    from ..sglang import MetricsPoller, diagnose_ttft, suggest_preset

    if not endpoints:
        sys.stderr.write(f"llmroute doctor: {config.source}: no routes, so no targets to probe\n")
        return 2
    write = (lambda _: 0) if as_json else sys.stdout.write
    write(f"{'target':40} {'client TTFT':>12} {'server TTFT':>12}  where the time goes\n")
    failed: list[str] = []
    rows: list[dict[str, Any]] = []
    for target in resolved.targets():
        provider = resolved.providers[target.provider]
        endpoint = endpoints[target.name]
        poller = None
        if provider.kind == "sglang":
            keys = {target.name: provider.api_key} if provider.api_key else None
            poller = MetricsPoller({target.name: str(provider.base_url)}, LiveStats(), keys=keys)
            await poller.poll_once()
        ttfts, itls, error = await _probe_target(endpoint, probes, timeout)
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
        else:
            suggestion = None
        rows.append(
            {
                "target": target.name,
                "probes": len(ttfts),
                "client_ttft": client_ttft,
                "server_ttft": server_ttft,
                "verdict": verdict,
                "error": error,
                "suggestion": None if suggestion is None else str(suggestion),
            }
        )
    catalog = await _catalog_report(resolved, verify, timeout)
    for line in catalog:
        write(f"{line}\n")
    if as_json:
        document = {"targets": rows, "catalog": catalog, "failed": len(failed)}
        sys.stdout.write(json.dumps(document) + "\n")
    if failed:
        count = len(resolved.targets())
        sys.stderr.write(
            f"llmroute doctor: {len(failed)} of {count} targets failed: {'; '.join(failed)}\n"
        )
        return 1
    return 0


async def _probe_target(
    endpoint: _Endpoint, probes: int, timeout: float
) -> tuple[list[float], list[float], str | None]:
    """``probes`` short streams from one target, one after another: the TTFT of each and its
    mean time between tokens, and the error that ended the probes (None: none did)."""
    from .. import AsyncOpenAI, OpenAIError
    from ..routing.causes import classify
    from ._bench_probe import _drain, _scrub

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
                    await _drain(stream)
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
                message = _scrub(error_text(exc), endpoint.secrets)
                error = f"{type(exc).__name__}: {message[:300]}"
                if classify(exc) == "misconfigured":  # a wrong key, model or permission
                    error = f"misconfigured (check its key and model name): {error}"
                break
    if error is None and not ttfts:
        error = "NoToken: the streams ended without a token"
    return ttfts, itls, error


def checked_line(name: str, spec: ProviderSpec, today: datetime.date) -> str:
    """The sentence saying when the catalog's facts on ``spec``'s vendor were last checked."""
    vendor = spec.display_name or spec.name
    checked = spec.checked
    if checked is None:
        return f"{name}: the catalog cites no sources for {vendor}."
    age = (today - checked).days
    if age > STALE_AFTER_DAYS:
        return (
            f"{name}: the catalog's facts on {vendor} were last checked on {checked}, {age} days "
            f"ago: they may be out of date (docs/providers.md lists the pages to check)."
        )
    return f"{name}: the catalog's facts on {vendor} were checked on {checked}."


def retired_lines(
    name: str, spec: ProviderSpec, configured: Sequence[str], today: datetime.date
) -> list[str]:
    """One line per ``configured`` model the catalog lists as retired (with or without a key,
    whatever the vendor's ``/models`` says): its shutdown date and the named replacement."""
    vendor = spec.display_name or spec.name
    return [
        f"{name}: retired: {retired.notice(vendor, model, today)} (the catalog's retired_models; "
        f"requests still go to {model} while {vendor} answers it)"
        for model in sorted(set(configured))
        if (retired := spec.retired_models.get(model)) is not None
    ]


def models_lines(
    name: str, spec: ProviderSpec, configured: Sequence[str], listed: Sequence[str]
) -> list[str]:
    """What the vendor's ``/models`` (``listed``) says of the ``configured`` models: those it no
    longer lists (with the catalog's shutdown date and replacement when it knows them), and the
    newer ones it lists that the catalog's ``models`` do not know yet."""
    vendor = spec.display_name or spec.name
    offered = set(listed)
    lines: list[str] = []
    for model in sorted(set(configured) - offered):
        retired = spec.retired_models.get(model)
        if retired is not None:
            verb = "shut" if retired.shutdown < datetime.date.today() else "shuts"
            why = f"the catalog says it {verb} down on {retired.shutdown}, use {retired.use}"
        else:
            why = "the catalog does not say why: check the name"
        lines.append(f"{name}: no longer listed by {vendor}: {model} ({why})")
    if not lines:
        lines.append(f"{name}: {vendor} lists every configured model ({len(set(configured))}).")
    if spec.models:  # without the catalog's list every listed model would look new
        known = {*spec.models, *spec.retired_models, *configured}
        newer = sorted(offered - known)
        if newer:
            shown = ", ".join(newer[:NEWER_SHOWN])
            more = f" (and {len(newer) - NEWER_SHOWN} more)" if len(newer) > NEWER_SHOWN else ""
            lines.append(
                f"{name}: newer models {vendor} lists that the catalog does not know yet: "
                f"{shown}{more}"
            )
    return lines


async def _catalog_report(resolved: Resolved, verify: bool | str, timeout: float) -> list[str]:
    """Per provider based on a catalog entry: when its facts were checked and, for a hosted
    vendor with a key, what its ``/models`` says of the configured models."""
    configured: dict[str, list[str]] = {}
    for target in resolved.targets():
        configured.setdefault(target.provider, []).append(target.model)
    today = datetime.date.today()
    lines: list[str] = []
    for name in sorted(configured):
        provider = resolved.providers[name]
        if provider.kind is None:
            continue  # not from the catalog: nothing to date
        lines.append(checked_line(name, provider.spec, today))
        lines.extend(retired_lines(name, provider.spec, configured[name], today))
        if provider.spec.self_hosted or not provider.api_key:
            continue
        listed = await _list_models(provider, verify, timeout)
        if isinstance(listed, str):
            vendor = provider.spec.display_name or provider.spec.name
            lines.append(f"{name}: could not ask {vendor} for its models: {listed}")
        else:
            lines.extend(models_lines(name, provider.spec, configured[name], listed))
    return lines


async def _list_models(
    provider: ResolvedProvider, verify: bool | str, timeout: float
) -> list[str] | str:
    """The model ids the vendor's ``GET {base_url}/models`` lists, or why they could not be read
    (a sentence without the key)."""
    import httpx

    from .._secrets import masked_forms, provider_secrets, scrub
    from ..protocols import adapter_for
    from ..transport import make_ssl_context

    auth, params = adapter_for(provider.spec.protocol).models_request(provider.api_key or "")
    headers: dict[str, str] = {**provider.headers, **auth}
    secrets = provider_secrets([provider])
    masked = masked_forms(secrets)
    url = provider.base_url.join("models")
    try:
        trust = make_ssl_context(verify if provider.verify is None else provider.verify)
        async with httpx.AsyncClient(verify=trust, timeout=timeout) as http:
            with anyio.fail_after(timeout):
                response = await http.get(url, headers=headers, params=params)
    except TimeoutError:
        return f"no answer from {url} within {timeout:g} s"
    except httpx.HTTPError as exc:
        text = scrub(" ".join(str(exc).split()), secrets, "<key>", masked)
        return f"{type(exc).__name__} from {url}: {text[:200]}"
    if response.status_code >= 400:
        text = scrub(" ".join(response.text.split()), secrets, "<key>", masked)
        hint = " (check its key)" if response.status_code in (401, 403) else ""
        return f"{url} answered {response.status_code}{hint}: {text[:200]}"
    try:
        data = response.json()["data"]
        return [str(entry["id"]) for entry in data]
    except (ValueError, KeyError, TypeError):
        return f"{url} answered 200 without a models list (no data[].id)"
