"""``llmroute keys create|list|show|update|rotate|revoke|teams|team``: a gateway's keys and
teams, managed over its admin API (``/admin/keys``, ``/admin/teams``) with an admin key.

The gateway is named by ``--url`` (or ``$LLMROUTE_GATEWAY_URL``) and the admin key read from
``$LLMROUTE_ADMIN_KEY`` (or ``--admin-key``; a flag shows in the process list). Every answer is
a sentence or a table, or the gateway's JSON with ``--json``; a mistake is a sentence and exit
status 1 (2 for the command line's own), never a traceback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import ssl
import sys
from typing import Any

from ._format import add_tls_options, http_url, tls_verify
from ._parser import examples

__all__ = ["ADMIN_KEY_ENV", "URL_ENV", "KeysError", "admin_root", "register"]

ADMIN_KEY_ENV = "LLMROUTE_ADMIN_KEY"
URL_ENV = "LLMROUTE_GATEWAY_URL"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?", re.I)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LIMITS = (
    ("rpm", int, "requests per minute"),
    ("tpm", int, "tokens per minute"),
    ("budget_tokens", int, "tokens per budget period"),
    ("budget_usd", str, "USD per budget period (25.50), at the targets' prices"),
    ("budget_period", str, "the budget's period: day, month or a duration such as 12h"),
    ("soft_limit", float, "the share of the budget (0.8) at which the gateway says so"),
)
_KEY_ONLY = (
    ("max_tokens", int, "a request asking for more is refused (400)"),
    ("default_max_tokens", int, "given to a request naming no max_tokens"),
    ("max_concurrency", int, "requests in flight"),
    ("ttft_target_ms", float, "the key's latency goal in milliseconds"),
)


class KeysError(Exception):
    """A command that failed, as a sentence; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def admin_root(url: str) -> str:
    """The gateway's root URL from ``url`` (a bare ``host:port``, a root, or a base URL ending
    in ``/v1``); :class:`KeysError` (status 2) when it is not an http(s) URL."""
    try:
        parsed = http_url(url, "http://127.0.0.1:8000")
    except ValueError as exc:
        raise KeysError(str(exc), 2) from None
    path = parsed.path.rstrip("/").removesuffix("/v1")
    return str(parsed.copy_with(path=path or "/", query=None, fragment=None)).rstrip("/")


def _seconds(text: str, flag: str) -> float:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise KeysError(f"{flag} {text!r}: expected a duration such as 90s, 10m, 12h or 30d", 2)
    return float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]


def _model_limits(given: list[str]) -> dict[str, dict[str, int]]:
    """``--model-limit chat:rpm=100,tpm=5000`` (repeatable) as ``model_limits``."""
    out: dict[str, dict[str, int]] = {}
    for text in given:
        model, _, rest = text.rpartition(":")
        limits: dict[str, int] = {}
        for part in rest.split(","):
            name, _, value = part.partition("=")
            if not model or name.strip() not in ("rpm", "tpm") or not value.strip().isdigit():
                raise KeysError(
                    f"--model-limit {text!r}: expected MODEL:rpm=N,tpm=N (e.g. chat-large:rpm=10)",
                    2,
                )
            limits[name.strip()] = int(value)
        out[model] = limits
    return out


def _add_limits(parser: argparse.ArgumentParser, *, key: bool) -> None:
    fields = _LIMITS + (_KEY_ONLY if key else ())
    for name, kind, text in fields:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)
    parser.add_argument(
        "--model-limit",
        action="append",
        default=[],
        metavar="MODEL:rpm=N,tpm=N",
        help="limits of requests to one model name (repeatable)",
    )
    if key:
        parser.add_argument("--team", help="the team whose limits and budget the key shares")
        parser.add_argument("--models", help="the model names the key may use, comma-separated")
        expiry = parser.add_mutually_exclusive_group()
        expiry.add_argument(
            "--expires-at", metavar="TIME", help="when it stops working: 2027-01-31T00:00:00Z"
        )
        expiry.add_argument(
            "--expires-in", metavar="DURATION", help="when it stops working, from now: 30d, 12h"
        )


def _settings(args: argparse.Namespace, *, key: bool) -> dict[str, Any]:
    fields = _LIMITS + (_KEY_ONLY if key else ())
    body: dict[str, Any] = {
        name: getattr(args, name) for name, _, _ in fields if getattr(args, name) is not None
    }
    if args.model_limit:
        body["model_limits"] = _model_limits(args.model_limit)
    if key:
        if args.team is not None:
            body["team"] = args.team
        if args.models is not None:
            body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        if args.expires_at is not None:
            body["expires_at"] = args.expires_at
        if args.expires_in is not None:
            now = datetime.datetime.now(datetime.UTC).timestamp()
            body["expires_at"] = now + _seconds(args.expires_in, "--expires-in")
    return body


def _common(parser: argparse.ArgumentParser) -> None:
    """The options every ``llmroute keys`` command takes: where the gateway is, the admin key,
    ``--json``, the timeout and TLS."""
    parser.add_argument(
        "--url", help=f"the gateway, e.g. http://127.0.0.1:8000 (default: ${URL_ENV})"
    )
    parser.add_argument(
        "--admin-key",
        help=f"a key with admin = true (default: ${ADMIN_KEY_ENV}; prefer the variable: a flag "
        "shows in the process list)",
    )
    parser.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds a call may take (30)"
    )
    add_tls_options(parser)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "keys",
        help="a gateway's keys and teams: create, list, update, rotate, revoke",
        description=(
            "Manage a running gateway's keys and teams over its admin API, with an admin key "
            f"(${ADMIN_KEY_ENV}) and the gateway's URL (${URL_ENV} or --url). A key's secret "
            "is shown once, when it is made or rotated."
        ),
        epilog=examples(
            "llmroute keys create web --team ml --rpm 600 --expires-in 90d",
            "llmroute keys list --url http://127.0.0.1:8000",
            "llmroute keys rotate web --overlap 1h",
        ),
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str, *lines: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
        sub.epilog = examples(*lines)
        _common(sub)
        return sub

    create = action(
        "create",
        "make a key (its secret is shown once)",
        "llmroute keys create web --rpm 600 --model-limit chat-large:rpm=10",
        "llmroute keys create batch --team ml --expires-at 2027-01-31T00:00:00Z --json",
    )
    create.add_argument("name", help="the key's name (letters, digits, . _ -)")
    _add_limits(create, key=True)
    action(
        "list",
        "every key: name, source, prefix, team, expiry, limits",
        "llmroute keys list",
        "llmroute keys list --json --url https://gw.internal:8443 --ca ca.pem",
    )
    show = action("show", "one key", "llmroute keys show web", "llmroute keys show web --json")
    show.add_argument("name")
    update = action(
        "update",
        "change a key's settings",
        "llmroute keys update web --rpm 1200",
        "llmroute keys update web --clear expires_at --clear team",
    )
    update.add_argument("name")
    _add_limits(update, key=True)
    update.add_argument(
        "--clear",
        action="append",
        default=[],
        metavar="FIELD",
        help="remove a setting (rpm, team, expires_at, ...; repeatable)",
    )
    rotate = action(
        "rotate",
        "give a key a new value (shown once)",
        "llmroute keys rotate web --overlap 1h",
        "llmroute keys rotate web --json",
    )
    rotate.add_argument("name")
    rotate.add_argument(
        "--overlap",
        default="0s",
        metavar="DURATION",
        help="how long the old value keeps working (default 0s: it stops now)",
    )
    revoke = action(
        "revoke",
        "stop a key at once",
        "llmroute keys revoke web",
        "llmroute keys revoke web --json",
    )
    revoke.add_argument("name")
    action(
        "teams",
        "every team: its limits and keys",
        "llmroute keys teams",
        "llmroute keys teams --json",
    )
    team = action(
        "team",
        "make, change, show or delete a team",
        "llmroute keys team set ml --rpm 3000 --budget-tokens 50000000 --budget-period month",
        "llmroute keys team delete ml",
    )
    team.add_argument("team_action", choices=["set", "show", "delete"])
    team.add_argument("name")
    _add_limits(team, key=False)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        return _command(args)
    except KeysError as exc:
        sys.stderr.write(f"llmroute keys: {exc}\n")
        return exc.status
    except ValueError as exc:  # tls_verify's --ca sentences
        sys.stderr.write(f"{exc}\n")
        return 2


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """The method, path and body of the command's call."""
    action, name = args.action, getattr(args, "name", None)
    if action == "create":
        return "POST", "/admin/keys", {"name": name, **_settings(args, key=True)}
    if action == "list":
        return "GET", "/admin/keys", None
    if action == "show":
        return "GET", f"/admin/keys/{name}", None
    if action == "update":
        body: dict[str, Any] = _settings(args, key=True)
        for field in args.clear:
            body[field.replace("-", "_")] = None
        if not body:
            raise KeysError("update: give a setting to change (--rpm 100, --clear team, ...)", 2)
        return "PATCH", f"/admin/keys/{name}", body
    if action == "rotate":
        return (
            "POST",
            f"/admin/keys/{name}/rotate",
            {"overlap": _seconds(args.overlap, "--overlap")},
        )
    if action == "revoke":
        return "DELETE", f"/admin/keys/{name}", None
    if action == "teams":
        return "GET", "/admin/teams", None
    method = {"set": "PUT", "show": "GET", "delete": "DELETE"}[args.team_action]
    team = _settings(args, key=False) if method == "PUT" else None
    return method, f"/admin/teams/{name}", team


def _command(args: argparse.Namespace) -> int:
    import httpx

    url = args.url or os.environ.get(URL_ENV)
    if not url:
        raise KeysError(f"give the gateway's URL: --url http://127.0.0.1:8000 or ${URL_ENV}", 2)
    root = admin_root(url)
    key = args.admin_key or os.environ.get(ADMIN_KEY_ENV)
    if not key:
        raise KeysError(f"no admin key: set {ADMIN_KEY_ENV} (a key with admin = true)", 2)
    verify = tls_verify(args, "llmroute keys")
    context: ssl.SSLContext | bool = (
        verify if isinstance(verify, bool) else ssl.create_default_context(cafile=verify)
    )
    method, path, body = _request(args)
    try:
        with httpx.Client(verify=context, timeout=args.timeout) as client:
            answer = client.request(
                method,
                root + path,
                json=body,
                headers={"authorization": f"Bearer {key}"},
            )
    except httpx.HTTPError as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise KeysError(f"cannot reach the gateway at {root}: {why}") from None
    try:
        data = answer.json()
    except ValueError:
        data = None
    if answer.status_code >= 400:
        raise KeysError(_refusal(answer.status_code, data, root))
    if not isinstance(data, dict):
        raise KeysError(f"{root} answered {method} {path} with something other than JSON")
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    sys.stdout.write(_describe(args, data))
    return 0


def _refusal(status: int, data: Any, root: str) -> str:
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if status == 401:
        return f"the gateway at {root} refused the admin key (401): {message or 'not a key it has'}"
    if status == 403:
        return f"the key is not an admin key (403): {message or ''}".rstrip(": ")
    if status == 404 and error is None:
        return f"{root} has no admin API (404): is it an llmroute gateway?"
    return f"{message or 'HTTP ' + str(status)} (HTTP {status})"


def _when(moment: Any) -> str:
    if not isinstance(moment, int | float):
        return "never"
    when = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _limits_text(limits: dict[str, Any]) -> str:
    parts = []
    for name, value in limits.items():
        if name == "model_limits" and isinstance(value, dict):
            for model, own in value.items():
                inner = ",".join(f"{k}={v}" for k, v in own.items() if v is not None)
                parts.append(f"{model}:{inner}")
        elif isinstance(value, list):
            parts.append(f"{name}={','.join(map(str, value))}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts) or "-"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


def _describe(args: argparse.Namespace, data: dict[str, Any]) -> str:
    action = args.action
    if action == "list":
        rows = [["NAME", "SOURCE", "PREFIX", "TEAM", "EXPIRES", "LIMITS"]]
        for key in data.get("data", []):
            expires = _when(key.get("expires_at")) + (" (expired)" if key.get("expired") else "")
            rows.append(
                [
                    key["name"],
                    key.get("source", ""),
                    key.get("prefix") or "-",
                    key.get("team") or "-",
                    expires,
                    _limits_text(key.get("limits", {})),
                ]
            )
        return _table(rows)
    if action == "teams":
        rows = [["TEAM", "SOURCE", "KEYS", "LIMITS"]]
        for team in data.get("data", []):
            keys = ",".join(team.get("keys", [])) or "-"
            rows.append(
                [team["name"], team.get("source", ""), keys, _limits_text(team.get("limits", {}))]
            )
        return _table(rows)
    if action == "team":
        if args.team_action == "delete":
            return f"Deleted team {data['name']!r}.\n"
        keys = ", ".join(data.get("keys", [])) or "none"
        limits = _limits_text(data.get("limits", {}))
        return f"Team {data['name']!r} ({data.get('source')}): {limits}; keys: {keys}.\n"
    if action == "revoke":
        return f"Revoked key {data['name']!r}: its requests get 401 from now on.\n"
    name = data["name"]
    summary = (
        f"prefix {data.get('prefix') or '-'}, team {data.get('team') or '-'}, "
        f"expires {_when(data.get('expires_at'))}, limits {_limits_text(data.get('limits', {}))}"
    )
    if action in ("show", "update"):
        verb = "Updated key" if action == "update" else "Key"
        return f"{verb} {name!r} ({data.get('source')}): {summary}.\n"
    secret = data.get("key", "")
    if action == "create":
        head = f"Created key {name!r}: {summary}."
    else:
        until = data.get("previous_valid_until")
        old = f"the old value works until {_when(until)}" if until else "the old value stops now"
        head = f"Rotated key {name!r}: new prefix {data.get('prefix')}; {old}."
    return (
        f"{head}\nIts secret, shown this once (the gateway keeps only its digest):\n\n"
        f"    {secret}\n\n"
    )
