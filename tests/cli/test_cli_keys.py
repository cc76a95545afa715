"""``llmroute keys``, against a real gateway whose admin API keeps its keys in ``keys_file``
(no Redis): the file gains digests below its marker and keeps the operator's own lines, a key
made from the command line works and is shown once, a declared key wins a name clash, and
every mistake is a sentence with a non-zero status, never a traceback."""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmroute.cli import main
from llmroute.server import Gateway
from llmroute.server._keystore import MARKER
from llmroute.testing import Profile, Simulator

ADMIN = "gw-cli-admin-0123456789"
ENVIRON = {"GW_CLI_ADMIN": ADMIN}
MESSAGES = [{"role": "user", "content": "Tell me about keys on the command line."}]
OPERATOR = '# the operator\'s own file\n[keys.ops]\nenv = "GW_CLI_ADMIN"\nadmin = true  # ops\n'


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5), tls=False) as server:
        yield server


@pytest.fixture
def gateway(sim: Simulator, tmp_path: Path) -> Iterator[Gateway]:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(OPERATOR)
    config: dict[str, Any] = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": "sk-cli-upstream-0123"}},
        "models": {"chat": {"targets": ["sim:m"]}, "chat-large": {"targets": ["sim:l"]}},
        "gateway": {"keys_file": str(keys_file), "teams": {"ml": {"rpm": 100}}},
    }
    with Gateway(config, environ=ENVIRON, max_retries=0) as server:
        yield server


def keys(
    gateway: Gateway, capsys: pytest.CaptureFixture[str], *args: str, key: str | None = ADMIN
) -> tuple[int, str, str]:
    """``llmroute keys <args>`` with ``$LLMROUTE_GATEWAY_URL`` the gateway's base URL: its
    status, stdout and stderr."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLMROUTE_GATEWAY_URL", gateway.base_url)
        if key is None:
            env.delenv("LLMROUTE_ADMIN_KEY", raising=False)
        else:
            env.setenv("LLMROUTE_ADMIN_KEY", key)
        status = main(["keys", *args])
    out, err = capsys.readouterr()
    return status, out, err


def chat(gateway: Gateway, key: str, model: str = "chat") -> int:
    answer = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": model, "messages": MESSAGES},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    return answer.status_code


def test_create_list_rotate_revoke(gateway: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = keys(
        gateway,
        capsys,
        "create",
        "web",
        "--rpm",
        "100",
        "--team",
        "ml",
        "--model-limit",
        "chat-large:rpm=1",
        "--expires-in",
        "30d",
    )
    assert (status, err) == (0, "")
    secret = out.split("shown this once")[1].split()[-1]
    assert out.startswith("Created key 'web': prefix llmr-") and secret.startswith("llmr-")
    assert chat(gateway, secret) == 200
    assert [chat(gateway, secret, "chat-large") for _ in range(2)] == [200, 429]
    # The file: the operator's lines as they were, then the marker and a digest, no key.
    text = Path(gateway.app.settings.keys_file or "").read_text()
    assert text.startswith(OPERATOR.rstrip("\n")) and MARKER in text
    assert secret not in text
    stored = tomllib.loads(text)["api_keys"]["web"]
    assert stored["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert stored["team"] == "ml" and stored["model_limits"] == {"chat-large": {"rpm": 1}}

    status, out, _ = keys(gateway, capsys, "list")
    assert status == 0 and secret not in out
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "PREFIX", "TEAM", "EXPIRES", "LIMITS"]
    web = next(line for line in lines if line.startswith("web "))
    assert "api" in web and secret[:12] in web and " ml " in web and "rpm=100" in web
    assert next(line for line in lines if line.startswith("ops ")).split()[1] == "file"

    status, out, _ = keys(gateway, capsys, "rotate", "web", "--overlap", "1h", "--json")
    rotated = json.loads(out)
    assert status == 0 and rotated["previous_valid_until"] is not None
    assert chat(gateway, secret) == 200 and chat(gateway, rotated["key"]) == 200
    stored = tomllib.loads(Path(gateway.app.settings.keys_file or "").read_text())["api_keys"]
    assert len(stored["web"]["previous"]) == 1  # the old digest, until the overlap's end
    assert not {"admin", "slo_percentile"} & set(stored["web"])  # only what was given

    status, out, _ = keys(gateway, capsys, "update", "web", "--rpm", "7", "--clear", "team")
    assert status == 0 and out.startswith("Updated key 'web'") and "rpm=7" in out
    assert "team -" in out

    status, out, _ = keys(gateway, capsys, "revoke", "web")
    assert status == 0 and out == "Revoked key 'web': its requests get 401 from now on.\n"
    assert chat(gateway, secret) == 401 and chat(gateway, rotated["key"]) == 401
    assert "[api_keys.web]" not in Path(gateway.app.settings.keys_file or "").read_text()


def test_teams_from_the_command_line(gateway: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = keys(gateway, capsys, "team", "set", "data", "--rpm", "5")
    assert status == 0 and out.startswith("Team 'data' (api): rpm=5; keys: none.")
    status, out, _ = keys(gateway, capsys, "create", "etl", "--team", "data")
    assert status == 0
    status, out, _ = keys(gateway, capsys, "teams")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["data"][1:3] == ["api", "etl"] and rows["ml"][1] == "config"
    status, _, err = keys(gateway, capsys, "team", "delete", "data")
    assert status == 1 and "has keys (etl)" in err


def test_a_teams_budget_in_money_from_the_command_line(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--budget-usd`` is sent as a decimal string, shown and written to keys_file exactly."""
    args = ["team", "set", "money", "--budget-usd", "12.3456789012", "--budget-period", "month"]
    status, out, err = keys(gateway, capsys, *args)
    assert status == 1 and "budget_usd" in err  # more than nine decimals: refused, named
    args[4] = "12.345678909"
    status, out, _ = keys(gateway, capsys, *args)
    assert status == 0 and "budget_usd=12.345678909" in out, out
    assert "budget_usd = 12.345678909" in Path(gateway.app.settings.keys_file or "").read_text()
    assert keys(gateway, capsys, "team", "delete", "money")[0] == 0


def test_a_declared_key_wins_a_name_clash(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = keys(gateway, capsys, "create", "shared")
    secret = out.split("shown this once")[1].split()[-1]
    assert chat(gateway, secret) == 200
    # The operator declares a key of that name above the marker (another value).
    path = Path(gateway.app.settings.keys_file or "")
    head, marker, tail = path.read_text().partition(MARKER)
    declared = "gw-cli-declared-0123456789"
    digest = hashlib.sha256(declared.encode()).hexdigest()
    path.write_text(f'{head}[keys.shared]\nsha256 = "{digest}"\n\n{marker}{tail}')
    assert gateway.app.reload()
    assert chat(gateway, declared) == 200
    assert chat(gateway, secret) == 401
    status, _, err = keys(gateway, capsys, "revoke", "shared")
    assert status == 1 and "declared in the keys file" in err


@pytest.mark.parametrize(
    ("args", "key", "status", "words"),
    [
        (["list"], None, 2, "no admin key: set LLMROUTE_ADMIN_KEY"),
        (["list"], "gw-cli-wrong-0123456789", 1, "refused the admin key (401)"),
        (["create", "x", "--rpm", "-3"], ADMIN, 1, "Invalid request: rpm: expected a number"),
        (["create", "x", "--model-limit", "chat"], ADMIN, 2, "expected MODEL:rpm=N"),
        (["create", "x", "--expires-in", "soon"], ADMIN, 2, "--expires-in 'soon'"),
        (["show", "nobody"], ADMIN, 1, "No key of that name. (HTTP 404)"),
        (["update", "ops"], ADMIN, 2, "give a setting to change"),
    ],
)
def test_mistakes_are_sentences(
    gateway: Gateway,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    key: str | None,
    status: int,
    words: str,
) -> None:
    got, out, err = keys(gateway, capsys, *args, key=key)
    assert got == status and out == ""
    assert err.startswith("llmroute keys: ") and words in err, err
    assert "Traceback" not in err and (key is None or key not in err)


def test_an_unreachable_gateway_is_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLMROUTE_ADMIN_KEY", ADMIN)
        status = main(["keys", "list", "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith(
        "llmroute keys: cannot reach the gateway at http://127.0.0.1:9"
    )
    assert ADMIN not in err


def test_no_key_store_without_redis_or_a_keys_file(
    sim: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    config: dict[str, Any] = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": "sk-cli-upstream-0123"}},
        "models": {"chat": {"targets": ["sim:m"]}},
        "gateway": {"keys": {"ops": "GW_CLI_ADMIN"}, "tenants": {"ops": {"admin": True}}},
    }
    with Gateway(config, environ=ENVIRON, max_retries=0) as server:
        status, out, err = keys(server, capsys, "create", "x")
        assert status == 1 and "no key store" in err
        status, out, _ = keys(server, capsys, "list")
        assert status == 0 and out.splitlines()[1].split()[:2] == ["ops", "config"]
