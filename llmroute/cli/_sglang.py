"""``llmroute sglang launch``: start SGLang servers tuned for TTFT and print their config."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ..sglang import Preset, SGLangServer

from ._parser import examples

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sglang = commands.add_parser(
        "sglang",
        help="self-hosted SGLang servers",
        epilog=examples(
            "llmroute sglang launch Qwen/Qwen2.5-7B-Instruct --dry-run",
            "llmroute sglang launch Qwen/Qwen2.5-7B-Instruct --gpus 0,1 > gpu.toml",
        ),
    )
    sglang_commands = sglang.add_subparsers(dest="sglang_command", required=True)
    launch = sglang_commands.add_parser(
        "launch",
        help="start SGLang servers tuned for TTFT and wait until they are ready",
        description="Arguments after -- go to SGLang as they are and win over llmroute's.",
        epilog=examples(
            "llmroute sglang launch Qwen/Qwen2.5-7B-Instruct --dry-run",
            "llmroute sglang launch Qwen/Qwen2.5-7B-Instruct --gpus 0,1,2,3 --tp 2 > gpu.toml",
            "llmroute sglang launch meta-llama/Llama-3.1-8B-Instruct -- --context-length 8192",
        ),
    )
    launch.add_argument("model_path", help="a Hugging Face model id or a local path")
    launch.add_argument(
        "--gpus", help="one server per GPU, or per --tp GPUs: e.g. 0,1,2,3 (with --tp 2: two)"
    )
    launch.add_argument(
        "--tp",
        type=int,
        help="tensor parallel size of each server (SGLang's --tp-size); GPUs are split in order",
    )
    launch.add_argument("--port", type=int, help="the first server's port (default: free ports)")
    launch.add_argument("--host", default="127.0.0.1")
    launch.add_argument("--served-model-name")
    launch.add_argument("--api-key", help="default: $SGLANG_API_KEY, else a random key")
    launch.add_argument("--api-key-env", default="SGLANG_API_KEY")
    launch.add_argument("--python", default=sys.executable, help="the interpreter with sglang")
    launch.add_argument("--image", help="run in this container image (docker run --gpus ...)")
    launch.add_argument(
        "--hf-cache",
        help="with --image: the host's Hugging Face cache to mount (default: $HF_HOME, else "
        "~/.cache/huggingface)",
    )
    launch.add_argument(
        "--no-hf-cache", action="store_true", help="with --image: mount no Hugging Face cache"
    )
    launch.add_argument("--log-dir")
    launch.add_argument("--startup-timeout", type=float, default=600.0)
    launch.add_argument("--grace", type=float, default=30.0, help="drain after SIGTERM (30 s)")
    launch.add_argument(
        "--gateway",
        action="store_true",
        help="start SGLang's model gateway (smg, cache-aware) in front of the servers and print "
        "one target for it (pip install 'llmroute[gateway]')",
    )
    launch.add_argument("--gateway-port", type=int, help="the gateway's port (default: free)")
    launch.add_argument(
        "--gateway-policy",
        default="cache_aware",
        help="the gateway's --policy: cache_aware (default), round_robin, power_of_two, ...",
    )
    presets = launch.add_argument_group(
        "presets", "beyond the TTFT-first defaults; checked against the installed SGLang"
    )
    presets.add_argument(
        "--speculative",
        choices=("eagle3", "eagle", "standalone"),
        help="speculative decoding with --draft-model (faster decoding)",
    )
    presets.add_argument(
        "--draft-model", help="the draft model (100M-1B parameters, or an EAGLE3 head)"
    )
    presets.add_argument(
        "--long-prompts",
        action="store_true",
        help="chunked prefill sized for long prompts (--chunked-prefill-size 16384)",
    )
    presets.add_argument(
        "--mem-fraction", type=float, help="share of GPU memory for weights and KV cache"
    )
    launch.add_argument("--provider", default="gpu", help="provider name in the printed config")
    launch.add_argument("--dry-run", action="store_true", help="print the commands, start none")
    launch.set_defaults(run=_run, takes_extra=True)


_PROG = "llmroute sglang launch"


def _say(text: str) -> None:
    sys.stderr.write(f"{_PROG}: {text}\n")
    sys.stderr.flush()


def _run(args: argparse.Namespace) -> int:
    try:
        return anyio.run(_sglang_launch, args, args.extra)
    except KeyboardInterrupt:  # asyncio's runner turns Ctrl-C into this, after the stop
        _say("SGLang stopped.")
        return 0


def _gpu_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(gpu) for gpu in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--gpus takes GPU numbers separated by commas, such as 0,1,2,3; got {text!r}"
        ) from None


def _presets(args: argparse.Namespace) -> list[Preset]:
    from ..sglang import chunked_prefill, memory_fraction, speculative_decoding

    chosen: list[Preset] = []
    if args.speculative:
        if not args.draft_model:
            raise ValueError("--speculative needs --draft-model (a small model or an EAGLE3 head)")
        chosen.append(speculative_decoding(args.draft_model, algorithm=args.speculative.upper()))
    elif args.draft_model:
        raise ValueError("--draft-model goes with --speculative eagle3|eagle|standalone")
    if args.long_prompts:
        chosen.append(chunked_prefill())
    if args.mem_fraction is not None:
        chosen.append(memory_fraction(args.mem_fraction))
    return chosen


async def _sglang_launch(args: argparse.Namespace, extra: list[str]) -> int:
    """Exit status: 0 once a signal stopped the servers, 1 when a server failed (exited, not
    ready in time, its port taken, another server on it), 2 for a mistake found before any
    server started (bad arguments, SGLang or smg not installed, a preset the version lacks, a GPU
    the host lacks)."""
    from ..sglang import (
        SGLangConfigError,
        SGLangError,
        SGLangGatewayNotInstalled,
        SGLangNotInstalled,
    )

    try:
        server = _new_server(args, extra)
        gpu = None if _standin_in_use() else _no_gpu(args)
        if gpu is not None and not args.dry_run:
            _say(f"{gpu}: launch on a host that has one (--dry-run shows the commands anywhere)")
            return 2
        if gpu is not None:
            _say(f"{gpu}: the commands below would not start here")
        if args.dry_run:
            sys.stdout.write(_dry_run(server, args))
            return 0
    except (ValueError, TypeError) as exc:
        _say(str(exc))
        return 2
    except (SGLangNotInstalled, SGLangGatewayNotInstalled, SGLangConfigError) as exc:
        _say(str(exc))
        return 2
    except SGLangError as exc:
        _say(str(exc))
        return 1
    return await _until_stopped(server, args)


def _new_server(args: argparse.Namespace, extra: list[str]) -> SGLangServer:
    """The servers the arguments describe, not started yet (ValueError, TypeError or an
    SGLangError for an argument that cannot be)."""
    import os

    from ..sglang import SGLangServer

    return SGLangServer(
        args.model_path,
        presets=_presets(args),
        served_model_name=args.served_model_name,
        port=args.port,
        host=args.host,
        api_key=args.api_key or os.environ.get(args.api_key_env) or None,
        python=args.python,
        image=args.image,
        hf_cache=False if args.no_hf_cache else args.hf_cache,
        gpus=_gpu_list(args.gpus),
        tp=args.tp,
        extra_args=extra,
        log_dir=args.log_dir,
        startup_timeout=args.startup_timeout,
        grace=args.grace,
        gateway=args.gateway,
        gateway_port=args.gateway_port,
        gateway_policy=args.gateway_policy,
    )


async def _until_stopped(server: SGLangServer, args: argparse.Namespace) -> int:
    """Start the servers, print their config once they are ready, and keep them until a signal
    or a server's exit (1) stops them all."""
    import os
    import signal

    from ..sglang import (
        SGLangConfigError,
        SGLangError,
        SGLangGatewayNotInstalled,
        SGLangNotInstalled,
        StartupProgress,
    )

    def report(progress: StartupProgress) -> None:
        if not reported:
            reported.append(progress)
            _say(
                f"started {len(server)} SGLang server(s) of {server.model_path}, logs in "
                f"{server.log_dir}; waiting until they are ready (Ctrl-C stops them)"
            )
        _say(f"{progress}")

    reported: list[StartupProgress] = []
    status = 0
    # Signals are caught from before the start to after the stop: a SIGTERM or SIGHUP (a closed
    # terminal) at any moment stops the servers, and a second one cannot cut the drain short.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(stop_on_signal)
            try:
                await server.start(progress=report)
                key_file = server.log_dir / "api_key"
                fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(server.api_key + "\n")
                config = _launched_config(server, args.provider, args.api_key_env, key_file)
                sys.stdout.write(config)
                sys.stdout.flush()
                worker, code = await server.wait_exited()
                tail = "\n".join(server.log_tail(worker))
                _say(f"server {worker} exited with status {code}; the end of its log:\n{tail}")
                status = 1
            except (SGLangNotInstalled, SGLangGatewayNotInstalled, SGLangConfigError) as exc:
                _say(str(exc))
                return 2
            except SGLangError as exc:
                _say(str(exc))
                status = 1
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await server.stop()
    _say("SGLang stopped.")
    return status


def _no_gpu(args: argparse.Namespace) -> str | None:
    """A sentence when this host shows no NVIDIA GPU (``nvidia-smi`` is not on its PATH),
    else ``None``."""
    import shutil

    if shutil.which("nvidia-smi") is not None:
        return None
    where = "SGLang's container (--image)" if args.image else "SGLang's server"
    return (
        f"nvidia-smi is not on this host's PATH, so it shows no GPU; {where} needs a CUDA GPU "
        "(NVIDIA's)"
    )


def _standin_in_use() -> bool:
    """Whether ``sglang`` is llmroute's stand-in (its directory on ``PYTHONPATH``, as the tests
    and docs/sglang.md's "Testing without a GPU" put it): it needs no GPU."""
    import os
    from pathlib import Path

    standin = (Path(__file__).resolve().parent.parent / "testing" / "sglang_standin").resolve()
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(entry and Path(entry).resolve() == standin for entry in entries)


def _dry_run(server: object, args: argparse.Namespace) -> str:
    """What ``--dry-run`` prints: each server's command as a TOML comment, then the config
    the launch would print, so ``--dry-run > gpu.toml`` is valid TOML. Without SGLang (or
    with SGLang that cannot be asked) the commands are those of the newest SGLang, said so on
    stderr with how to install it."""
    import os
    import shlex

    from ..sglang import SGLangError, SGLangNotInstalled, SGLangServer

    assert isinstance(server, SGLangServer)
    lines = [f"# llmroute sglang launch --dry-run: nothing started. {len(server)} server(s):"]
    for worker in range(len(server)):
        try:
            argv = server.command(worker)
        except SGLangNotInstalled as exc:
            if worker == 0:
                _say(f"{exc}. The commands below are the newest SGLang's (sglang serve).")
            argv = server.planned_command(worker)
        except SGLangError as exc:
            if worker == 0:
                _say(f"{exc}; the commands below are the newest SGLang's (sglang serve).")
            argv = server.planned_command(worker)
        shown = shlex.join(argv)
        devices = server.worker_env(worker).get("CUDA_VISIBLE_DEVICES")
        if devices is not None and devices != os.environ.get("CUDA_VISIBLE_DEVICES"):
            shown = f"CUDA_VISIBLE_DEVICES={devices} {shown}"
        lines.append(f"#   {shown}")
    if server.gateway is not None:
        lines += [
            "# SGLang's gateway in front of them:",
            f"#   {shlex.join(server.gateway.argv())}",
        ]
    ports = "the ports given" if args.port is not None else "free ports now; a launch picks its own"
    lines += [f"# Once they run, route to them with this config ({ports}):", ""]
    return "\n".join(lines) + "\n" + _route_tables(server, args.provider, args.api_key_env)


def _launched_config(server: object, provider: str, key_env: str, key_file: object) -> str:
    from ..sglang import SGLangServer

    assert isinstance(server, SGLangServer)
    gateway = server.gateway_url
    lines = [
        f"# SGLang {server.version or ''} is ready: {len(server)} server(s) of "
        f"{server.served_model_name}; logs in {server.log_dir}",
        *(
            [f"# SGLang's gateway (smg, {server.gateway.policy}) fronts them at {gateway}"]
            if server.gateway is not None
            else []
        ),
        f"# The API key is in {key_file} (mode 0600): export {key_env}=$(cat {key_file})",
        "# Route to it with this config (Ctrl-C stops the servers):",
        "",
    ]
    return "\n".join(lines) + "\n" + _route_tables(server, provider, key_env)


def _route_tables(server: object, provider: str, key_env: str) -> str:
    """The ``[providers.*]`` and ``[models.chat]`` tables that route to ``server``."""
    from ..sglang import SGLangServer

    assert isinstance(server, SGLangServer)
    gateway = server.gateway_url
    lines: list[str] = []
    for name, table in server.providers(provider).items():
        lines += [
            f"[providers.{name}]",
            f'kind = "{table["kind"]}"',
            f'base_url = "{table["base_url"]}"',
            f'api_key_env = "{key_env}"',
            "",
        ]
    targets = ", ".join(f'"{t}"' for t in server.targets(provider))
    # Behind a gateway the gateway picks the worker; llmroute routes across it and any vendors.
    policy = "hedge" if gateway else "prefix"
    lines += ["[models.chat]", f"targets = [{targets}]", f'policy = "{policy}"', ""]
    return "\n".join(lines) + "\n"
