"""What a process holds, read from ``/proc`` (Linux): file descriptors, TCP connections, memory.

Used by the reliability tests and the load and soak benchmarks to count leaks. Elsewhere than
Linux, :func:`available` is false and the counts are not taken.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available", "cpu_seconds", "open_fds", "rss_bytes", "tcp_connections"]

_PROC = Path("/proc/self")
_ESTABLISHED = "01"


def available() -> bool:
    """Whether this system has the ``/proc`` files read here."""
    return (_PROC / "fd").is_dir() and Path("/proc/net/tcp").is_file()


def open_fds() -> int:
    """The number of file descriptors this process has open."""
    return len(os.listdir(_PROC / "fd"))


def rss_bytes() -> int:
    """This process's resident memory now, in bytes."""
    for line in (_PROC / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used so far, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _socket_inodes() -> set[str]:
    inodes: set[str] = set()
    for fd in os.listdir(_PROC / "fd"):
        try:
            link = os.readlink(_PROC / "fd" / fd)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def tcp_connections(remote_port: int) -> int:
    """This process's established TCP connections to ``remote_port`` (IPv4 and IPv6)."""
    inodes = _socket_inodes()
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = int(fields[2].rsplit(":", 1)[1], 16)
            if port == remote_port and fields[3] == _ESTABLISHED and fields[9] in inodes:
                count += 1
    return count
