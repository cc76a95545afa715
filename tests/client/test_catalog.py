"""The vendor catalog: every ``providers/*.toml`` file, the errors a bad file gives, the wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from llmroute._catalog import (
    CatalogError,
    ProviderSpec,
    catalog_dir,
    load_catalog,
    load_provider_file,
    parse_provider,
)
from llmroute.config import ConfigError, resolve_provider

ROOT = Path(__file__).resolve().parents[2]
PROVIDERS = ROOT / "providers"

REQUIRED = {
    "openai",
    "anthropic",
    "deepseek",
    "groq",
    "together",
    "fireworks",
    "mistral",
    "openrouter",
    "moonshot",
    "dashscope",
    "siliconflow",
    "siliconflow-global",
    "zhipu",
    "gemini",
    "xai",
    "sglang",
    "vllm",
    "ollama",
}
SELF_HOSTED = {"sglang": 30000, "sglang-gateway": 30000, "vllm": 8000, "ollama": 11434}
ENV_VAR = re.compile(r"[A-Z][A-Z0-9_]*")
SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie"}

CATALOG = load_catalog()


def test_every_required_vendor_is_in_the_catalog() -> None:
    assert REQUIRED <= set(CATALOG)
    assert {path.stem for path in PROVIDERS.glob("*.toml")} == set(CATALOG)
    assert catalog_dir().resolve() == PROVIDERS.resolve()  # a source checkout reads providers/


def test_the_catalog_is_read_once_and_read_only() -> None:
    assert load_catalog() is CATALOG
    with pytest.raises(TypeError):
        CATALOG["x"] = CATALOG["openai"]  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_each_file_is_valid(name: str) -> None:
    path = PROVIDERS / f"{name}.toml"
    spec = CATALOG[name]
    assert spec == load_provider_file(path)
    assert spec.name == name
    assert spec.display_name
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert header, "the file opens with a comment citing its source"
    assert "https://" in "\n".join(header)

    url = httpx.URL(spec.base_url)
    assert url.host
    assert not url.query and not url.fragment
    assert not spec.base_url.endswith("/"), "base_url is written without a trailing slash"
    assert not url.path.endswith("/chat/completions")
    if spec.self_hosted:
        assert url.scheme == "http"
        assert url.host == "127.0.0.1"
        assert url.port == SELF_HOSTED[name]
        assert url.path == "/v1"
    else:
        assert url.scheme == "https"
        assert name not in SELF_HOSTED

    if spec.api_key_env is not None:
        assert ENV_VAR.fullmatch(spec.api_key_env), spec.api_key_env
    elif not spec.self_hosted:
        pytest.fail(f"{name}: a hosted vendor names the environment variable of its key")

    assert not SECRET_HEADERS & {key.lower() for key in spec.headers}
    assert httpx.URL(spec.docs).scheme == "https"

    if spec.continuation is not None and spec.continuation.base_url is not None:
        continuation_url = httpx.URL(spec.continuation.base_url)
        assert continuation_url.scheme == url.scheme
        assert continuation_url.host
        assert not spec.continuation.base_url.endswith("/")


def test_self_hosted_servers() -> None:
    assert {name for name, spec in CATALOG.items() if spec.self_hosted} == set(SELF_HOSTED)
    assert CATALOG["ollama"].api_key_env is None
    assert CATALOG["sglang"].api_key_env is None


@pytest.mark.parametrize(
    ("name", "message", "body", "base_url", "echoes"),
    [
        (
            "deepseek",
            {"prefix": True},
            {"thinking": {"type": "disabled"}},  # V4 thinks by default
            "https://api.deepseek.com/beta",
            False,
        ),
        ("mistral", {"prefix": True}, {}, None, True),  # the answer begins with the prefix
        ("moonshot", {"partial": True}, {}, None, False),
        ("dashscope", {"partial": True}, {"enable_thinking": False}, None, False),
        ("groq", {}, {}, None, False),
        ("openrouter", {}, {}, None, False),
        ("sglang", {}, {"continue_final_message": True}, None, False),
        (
            "vllm",
            {},
            {"continue_final_message": True, "add_generation_prompt": False},
            None,
            False,
        ),
    ],
)
def test_documented_continuations(
    name: str,
    message: dict[str, object],
    body: dict[str, object],
    base_url: str | None,
    echoes: bool,
) -> None:
    continuation = CATALOG[name].continuation
    assert continuation is not None
    assert continuation.message == message
    assert continuation.body == body
    assert continuation.base_url == base_url
    assert continuation.echoes_prefix is echoes


@pytest.mark.parametrize(
    "name",
    [
        "openai",
        "anthropic",
        "together",
        "fireworks",
        "siliconflow",
        "siliconflow-global",
        "zhipu",
        "gemini",
        "xai",
    ],
)
def test_no_continuation_where_none_is_documented(name: str) -> None:
    assert CATALOG[name].continuation is None


def test_protocols() -> None:
    assert CATALOG["anthropic"].protocol == "anthropic"
    assert CATALOG["anthropic"].base_url == "https://api.anthropic.com/v1"
    assert {name for name, spec in CATALOG.items() if spec.protocol != "openai"} == {"anthropic"}


# -- bad files ----------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "acme") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load_provider_file(path)
    return str(info.value)


def test_a_good_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'base_url = "https://api.acme.test/v1"\napi_key_env = "ACME_API_KEY"\n'
        "[continuation]\nmessage = { prefix = true }\n",
    )
    spec = load_provider_file(path)
    assert spec == ProviderSpec(
        name="acme",
        base_url="https://api.acme.test/v1",
        api_key_env="ACME_API_KEY",
        continuation={"message": {"prefix": True}},  # type: ignore[arg-type]
    )


def test_unknown_key(tmp_path: Path) -> None:
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1"\napi_key = "sk-123"\n')
    message = _error(path)
    assert message == f"{path}: api_key: unknown key"


def test_unknown_key_in_the_continuation_table(tmp_path: Path) -> None:
    path = _write(
        tmp_path, 'base_url = "https://api.acme.test/v1"\n[continuation]\nprefix = true\n'
    )
    assert _error(path) == f"{path}: continuation.prefix: unknown key"


def test_wrong_protocol(tmp_path: Path) -> None:
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1"\nprotocol = "grpc"\n')
    message = _error(path)
    assert message.startswith(f"{path}: protocol: expected ")
    assert "'openai'" in message and "'anthropic'" in message and "'grpc'" in message


# Vendors whose own documentation says base_url serves POST {base_url}/responses, and those that
# keep responses so that previous_response_id works (comments in each file cite the page).
RESPONSES = {
    "openai",
    "xai",
    "groq",
    "openrouter",
    "together",
    "fireworks",
    "mistral",
    "vllm",
    "sglang",
    "ollama",
}
RESPONSES_STORED = {"openai", "xai", "fireworks"}


def test_responses_api_capability() -> None:
    assert {name for name, spec in CATALOG.items() if spec.responses} == RESPONSES
    assert {name for name, spec in CATALOG.items() if spec.responses_stored} == RESPONSES_STORED
    for name in CATALOG:
        text = (PROVIDERS / f"{name}.toml").read_text(encoding="utf-8")
        assert "# Responses API: " in text, f"{name}: say what the vendor's docs say"
        assert re.search(r"^responses = (true|false)$", text, re.MULTILINE), name
    for name in RESPONSES:
        text = (PROVIDERS / f"{name}.toml").read_text(encoding="utf-8")
        comment = text[text.index("# Responses API: ") :].split("\nresponses")[0]
        assert "https://" in comment, f"{name}: cite the page that says so"


def test_responses_default_false_and_stored_needs_responses(tmp_path: Path) -> None:
    spec = parse_provider("acme", {"base_url": "https://api.acme.test/v1"}, source="t")
    assert spec.responses is False and spec.responses_stored is False
    stored = {"base_url": "https://api.acme.test/v1", "responses": True, "responses_stored": True}
    assert parse_provider("acme", stored, source="t").responses_stored
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1"\nresponses_stored = true\n')
    assert "responses_stored = true needs responses = true" in _error(path)
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1"\nresponses = "yes"\n')
    assert _error(path).startswith(f"{path}: responses: ")


def test_wrong_type(tmp_path: Path) -> None:
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1"\nstream_usage = "yes"\n')
    message = _error(path)
    assert message.startswith(f"{path}: stream_usage: ")
    assert "'yes'" in message


def test_invalid_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, 'base_url = "https://api.acme.test/v1\n')
    message = _error(path)
    assert message.startswith(f"{path}: not valid TOML: ")


def test_missing_base_url(tmp_path: Path) -> None:
    path = _write(tmp_path, 'display_name = "Acme"\n')
    assert _error(path) == f"{path}: base_url: required key is missing"


def test_every_mistake_is_listed(tmp_path: Path) -> None:
    path = _write(tmp_path, 'protocol = "grpc"\nbogus = 1\n')
    lines = _error(path).splitlines()
    assert len(lines) == 3
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert {line.split(": ")[1] for line in lines} == {"base_url", "protocol", "bogus"}


def test_a_name_that_is_not_the_file_name(tmp_path: Path) -> None:
    path = _write(tmp_path, 'name = "other"\nbase_url = "https://api.acme.test/v1"\n')
    assert _error(path) == f"{path}: name: expected 'acme' (the file's name), got 'other'"
    assert load_provider_file(_write(tmp_path, 'name = "acme"\nbase_url = "https://a.test"\n'))


def test_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    message = _error(path)
    assert message.startswith(f"{path}: cannot be read: ")


def test_parse_provider_names_its_source() -> None:
    with pytest.raises(CatalogError) as info:
        parse_provider("acme", {"base_url": 5}, source="llmroute.toml")
    assert str(info.value).startswith("llmroute.toml: base_url: ")


# -- the wheel ----------------------------------------------------------------------------------


def test_the_wheel_ships_the_catalog(tmp_path: Path) -> None:
    """Build a wheel from this checkout and find every catalog file inside it, where
    ``catalog_dir()`` looks for it once the wheel is installed (and the live page's files)."""
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("llmroute-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        expected = {f"llmroute/_providers/{path.name}" for path in PROVIDERS.glob("*.toml")}
        assert expected <= names
        for path in PROVIDERS.glob("*.toml"):
            assert archive.read(f"llmroute/_providers/{path.name}") == path.read_bytes()
        assert not any(name.startswith("providers/") for name in names)
        # The gateway's live page is package data too (llmroute/server/_live.py reads it).
        for name in ("live.html", "live.js", "live.css"):
            assert f"llmroute/server/live/{name}" in names
        site = tmp_path / "site"
        archive.extractall(site)

    # Imported from the unpacked wheel, the package reads its own copy of the catalog.
    probe = (
        "import llmroute, llmroute._catalog as c; "
        "print(llmroute.__file__); print(c.catalog_dir()); print(len(c.load_catalog()))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    package, folder, count = run.stdout.split()
    assert Path(package).parent == site / "llmroute"
    assert Path(folder) == site / "llmroute" / "_providers"
    assert int(count) == len(CATALOG)


def test_a_config_overrides_the_responses_capability() -> None:
    gpu = resolve_provider("gpu1", {"kind": "sglang", "responses": False}, environ={})
    assert gpu.spec.responses is False and CATALOG["sglang"].responses is True
    qwen = resolve_provider(
        "qwen_responses",
        {
            "kind": "dashscope",
            "base_url": "https://dashscope-intl.aliyuncs.com/api/v2/apps/protocols/compatible-mode/v1",
            "responses": True,
            "responses_stored": True,
        },
        environ={"DASHSCOPE_API_KEY": "sk-test"},
    )
    assert qwen.spec.responses and qwen.spec.responses_stored


def test_context_windows_are_cited_and_whole_token_counts(tmp_path: Path) -> None:
    for name, spec in CATALOG.items():
        if not spec.context_windows and spec.context_window is None:
            continue
        text = (PROVIDERS / f"{name}.toml").read_text(encoding="utf-8")
        comment = text[text.index("# Context windows") :].split("\n[context_windows]")[0]
        assert "https://" in comment, f"{name}: cite the page that states the windows"
        assert all(isinstance(w, int) and w >= 1 for w in spec.context_windows.values())
    assert CATALOG["anthropic"].window_for("claude-haiku-4-5-20251001") == 200_000
    assert CATALOG["openai"].window_for("gpt-6-luna") is None  # no figure from OpenAI's pages
    base = 'base_url = "https://api.acme.test/v1"\n'
    path = _write(tmp_path, base + "[context_windows]\nm = 0\n")
    assert _error(path).startswith(f"{path}: context_windows.m: ")
    path = _write(tmp_path, base + 'context_window = "8k"\n')
    assert _error(path).startswith(f"{path}: context_window: ")


def test_zhipu_reads_zai_api_key_then_its_old_name() -> None:
    """Zhipu's docs now set ZAI_API_KEY; ZHIPUAI_API_KEY (its old SDK's) still works."""
    assert CATALOG["zhipu"].api_key_env == "ZAI_API_KEY"
    both = {"ZAI_API_KEY": "k-new", "ZHIPUAI_API_KEY": "k-old"}
    assert resolve_provider("zhipu", {}, both).api_key == "k-new"
    assert resolve_provider("zhipu", {}, {"ZHIPUAI_API_KEY": "k-old"}).api_key == "k-old"
    with pytest.raises(ConfigError, match="no API key: set ZAI_API_KEY or api_key"):
        resolve_provider("zhipu", {}, {})
    # A config naming its own variable reads only that one, not the catalog's old name.
    with pytest.raises(ConfigError, match="set MY_GLM_KEY"):
        resolve_provider("zhipu", {"api_key_env": "MY_GLM_KEY"}, {"ZHIPUAI_API_KEY": "k-old"})


def test_siliconflow_has_a_china_and_a_global_entry_with_their_own_keys() -> None:
    china, world = CATALOG["siliconflow"], CATALOG["siliconflow-global"]
    assert china.base_url == "https://api.siliconflow.cn/v1"
    assert world.base_url == "https://api.siliconflow.com/v1"
    assert china.api_key_env == "SILICONFLOW_API_KEY"
    assert world.api_key_env == "SILICONFLOW_GLOBAL_API_KEY"  # separate accounts, separate keys
    assert not world.api_key_env_fallbacks
    resolved = resolve_provider("siliconflow-global", {}, {"SILICONFLOW_GLOBAL_API_KEY": "k"})
    assert str(resolved.base_url) == "https://api.siliconflow.com/v1/"
    with pytest.raises(ConfigError, match="set SILICONFLOW_GLOBAL_API_KEY"):
        resolve_provider("siliconflow-global", {}, {"SILICONFLOW_API_KEY": "k-china"})
