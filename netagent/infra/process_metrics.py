"""The agent process's own metrics, in the names every Prometheus client library exports
(`process_*`), so the standard dashboards and an operator's memory and CPU alerts work on
netagent as on any other exporter: resident and virtual memory, CPU seconds, open file
descriptors and their limit, the start time. Read from /proc/self at scrape time (Linux only,
as the agent is); a read that fails renders no sample, never a failed scrape.
"""
from __future__ import annotations

import os
import resource

from netagent.infra.metrics import Registry

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields() -> list[str]:
    """/proc/self/stat's fields after the command name (which may hold spaces and parentheses)."""
    with open("/proc/self/stat") as stat:
        return stat.read().rpartition(")")[2].split()


def _boot_time() -> float:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise LookupError("no btime in /proc/stat")


def cpu_seconds() -> float:
    fields = _stat_fields()
    return (int(fields[11]) + int(fields[12])) / TICKS   # utime, stime (fields 14 and 15 of stat)


def resident_bytes() -> float:
    return int(_stat_fields()[21]) * PAGE_SIZE            # rss (field 24)


def virtual_bytes() -> float:
    return float(_stat_fields()[20])                      # vsize (field 23)


def start_time() -> float:
    return _boot_time() + int(_stat_fields()[19]) / TICKS  # starttime (field 22), ticks after boot


def open_fds() -> float:
    return float(len(os.listdir("/proc/self/fd")))


def max_fds() -> float:
    return float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def register_process_metrics(registry: Registry) -> None:
    registry.callback_counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                              cpu_seconds)
    registry.callback_gauge("process_resident_memory_bytes", "Resident memory size in bytes.", resident_bytes)
    registry.callback_gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", virtual_bytes)
    registry.callback_gauge("process_start_time_seconds",
                            "Start time of the process since unix epoch in seconds.", start_time)
    registry.callback_gauge("process_open_fds", "Number of open file descriptors.", open_fds)
    registry.callback_gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds)
