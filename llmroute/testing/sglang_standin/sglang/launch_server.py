"""``python -m sglang.launch_server FLAGS``: the stand-in server, on every emulated version."""

import sys

from . import _standin

if __name__ == "__main__":
    _standin.run("launch_server", sys.argv[1:])
