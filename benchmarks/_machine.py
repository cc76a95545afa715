"""What a benchmark ran on: CPUs, CPU model, Python and package versions (for its report)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any


def machine(packages: Iterable[str]) -> dict[str, Any]:
    """CPU count and model, the Python, and the installed version of each of ``packages``."""
    cpu_model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for pkg in packages:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "versions": versions,
    }
