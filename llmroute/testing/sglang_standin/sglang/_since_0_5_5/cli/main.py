"""``sglang.cli.main``: the ``sglang serve`` console command's module (SGLang 0.5.5 and later).

``main()`` dispatches like the real one (``serve`` and ``generate``; unknown flags go to the
subcommand). The real module has no ``if __name__ == "__main__"`` guard (up to 0.5.23 at least), so
``python -m sglang.cli.main serve`` silently exits 0 there; the stand-in runs ``main()`` unless
``SGLANG_STANDIN_CLI_MAIN_GUARD=0`` asks for that real behaviour.
"""

import argparse
import importlib
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="subcommand", required=True)
    subparsers.add_parser("serve", help="Launch the SGLang server.", add_help=False)
    subparsers.add_parser("generate", help="Run inference on a multimodal model.", add_help=False)
    args, extra_argv = parser.parse_known_args()
    if args.subcommand == "serve":
        importlib.import_module("sglang._standin").run("serve", extra_argv)
    sys.stderr.write("sglang generate: not emulated by the llmroute stand-in\n")
    sys.exit(2)


if __name__ == "__main__" and os.environ.get("SGLANG_STANDIN_CLI_MAIN_GUARD", "1") != "0":
    main()
