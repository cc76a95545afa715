"""``GET /admin/usage`` and the fleet's figures in ``/metrics``: every key's and team's usage
(requests, errors, tokens, cache hits) and their limits' counters now.

With Redis (``limits_backend = "redis"``) each request's usage is added to its key's counters
there when it ends (in the script that frees its slot: no round trip of its own), so any
replica answers with the fleet's totals; each replica's own figures are kept beside them
(``"replica"``, or ``?scope=replica``). Without Redis, or while it cannot be reached, the
figures are this replica's (``"scope": "replica"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._admission import Admission
from ._limits import TARGET_SPEND, USAGE_FIELDS, Counts
from ._tenants import Scope, Team, Tenant, Tenants, team_scope, usd

__all__ = ["fleet_exposition", "new_usage", "usage_report"]


def new_usage() -> dict[str, int]:
    return dict.fromkeys(USAGE_FIELDS, 0)


def _limits(scope: Scope, counts: Counts) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rpm": scope.rpm,
        "requests_this_minute": counts.requests,
        "tpm": scope.tpm,
        "tokens_this_minute": counts.tokens,
    }
    if scope.id.count("#") == 0:  # a key's or a team's own: budgets are not per model
        out |= {
            "budget_tokens": scope.budget_tokens,
            "budget_period": scope.budget_period,
            "budget_spent": counts.spent if scope.budget_tokens else None,
        }
        if scope.soft_limit is not None:
            out["soft_limit"] = scope.soft_limit
        if scope.budget_nanos is not None:
            out |= {
                "budget_usd": usd(scope.budget_nanos),
                "budget_spent_usd": usd(counts.money),
                "budget_spent_nanos": counts.money,
            }
    return out


def _with_spend(figures: dict[str, Any]) -> dict[str, Any]:
    """A key's figures with its spend in dollars, in all and by target (``spend_by_target``:
    each target -> what the key's attempts there cost, a decimal string; together its spend),
    and the parts of it its other attempts (``hedge_usd``) and the gateway's estimates
    (``estimated_usd``) make."""
    by_target = {
        name[len(TARGET_SPEND) :]: usd(int(figures.pop(name)))
        for name in sorted(figures)
        if name.startswith(TARGET_SPEND)
    }
    figures["spend_usd"] = usd(int(figures.get("spend_nanos", 0)))
    figures["spend_by_target"] = by_target
    figures["hedge_usd"] = usd(hedge := int(figures.get("hedge_nanos", 0)))
    spend = int(figures.get("spend_nanos", 0))
    figures["hedge_share"] = round(hedge / spend, 4) if spend else None
    figures["estimated_usd"] = usd(int(figures.get("estimated_nanos", 0)))
    return figures


async def _scope_limits(
    admission: Admission, scopes: Mapping[str, Scope]
) -> dict[str, dict[str, Any]]:
    return {model: _limits(s, await admission.peek(s)) for model, s in scopes.items()}


async def _key_entry(
    name: str,
    tenant: Tenant,
    figures: Mapping[str, Mapping[str, int]],
    replica: Mapping[str, Mapping[str, int]],
    fleet: Mapping[str, Mapping[str, int]] | None,
    admission: Admission,
) -> dict[str, Any]:
    """A key's usage (and this replica's share, with the fleet's), team and limits."""
    entry = _with_spend(dict(figures.get(name) or new_usage()))
    if fleet is not None:
        entry["replica"] = _with_spend(dict(replica.get(name) or new_usage()))
    if tenant.team is not None:
        entry["team"] = tenant.team.name
    own = next((s for s in tenant.scopes if s.id == name), None)
    if own is not None:
        entry["limits"] = _limits(own, await admission.peek(own))
    models = {
        model: s
        for model, scopes in tenant.model_scopes.items()
        for s in scopes
        if s.id == f"{name}#{model}"
    }
    if models:
        entry["model_limits"] = await _scope_limits(admission, models)
    return entry


async def _team_entry(
    team_name: str, team: Team, tenants: Tenants, keys: Mapping[str, Any], admission: Admission
) -> dict[str, Any]:
    """A team's keys, the sum of their usage (``keys``: each key's entry), and its limits."""
    members = sorted(
        n for n, t in tenants.by_name.items() if t.team is not None and t.team.name == team_name
    )
    entry = new_usage()
    for member in members:
        for field_name in USAGE_FIELDS:
            entry[field_name] += int(keys[member].get(field_name, 0))
    out: dict[str, Any] = {"keys": members, **entry, "spend_usd": usd(entry["spend_nanos"])}
    out["hedge_usd"] = usd(entry["hedge_nanos"])
    out["estimated_usd"] = usd(entry["estimated_nanos"])
    shared = team_scope(team)
    if shared is not None:
        out["limits"] = _limits(shared, await admission.peek(shared))
    models = {
        model: Scope(
            f"@{team_name}#{model}", "", limits.rpm, limits.tpm, owner=team_name, kind="team"
        )
        for model, limits in (team.settings.model_limits or {}).items()
    }
    if models:
        out["model_limits"] = await _scope_limits(admission, models)
    return out


async def usage_report(
    tenants: Tenants,
    replica: Mapping[str, Mapping[str, int]],
    admission: Admission,
    created: int,
    scope: str = "fleet",
) -> dict[str, Any]:
    """The usage answer (see the module's docstring): ``replica`` is this replica's figures
    by key name; ``scope`` ``fleet`` (the default) or ``replica``."""
    fleet = await admission.fleet_usage() if scope == "fleet" else None
    figures: Mapping[str, Mapping[str, int]] = fleet if fleet is not None else replica
    keys: dict[str, Any] = {}
    for name, tenant in tenants.by_name.items():
        keys[name] = await _key_entry(name, tenant, figures, replica, fleet, admission)
    for name, gone in figures.items():  # keys revoked since
        if name not in keys:
            keys[name] = _with_spend(dict(gone)) | {"revoked": True}
    teams: dict[str, Any] = {}
    for team_name, team in tenants.teams.items():
        teams[team_name] = await _team_entry(team_name, team, tenants, keys, admission)
    return {
        "object": "usage",
        "scope": "fleet" if fleet is not None else "replica",
        "replica_since": created,
        "keys": keys,
        "teams": teams,
    }


def fleet_exposition(fleet: Mapping[str, Mapping[str, int]]) -> bytes:
    """The fleet's usage as Prometheus gauges (``llmroute_gateway_fleet_usage{key, kind}``):
    each replica reports the same fleet figures, so do not sum them over replicas."""
    lines = [
        "# HELP llmroute_gateway_fleet_usage Usage of each key summed over every replica "
        "(from Redis): requests, errors, prompt_tokens, completion_tokens, cache_hits, and "
        "spend_nanos, hedge_nanos and estimated_nanos in nano-dollars. Every "
        "replica reports the fleet's figures: take one replica's (max), do not sum them.",
        "# TYPE llmroute_gateway_fleet_usage gauge",
    ]
    for name in sorted(fleet):
        for kind in USAGE_FIELDS:
            value = int(fleet[name].get(kind, 0))
            lines.append(f'llmroute_gateway_fleet_usage{{key="{name}",kind="{kind}"}} {value}')
    return ("\n".join(lines) + "\n").encode()
