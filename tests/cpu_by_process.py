"""Where a command's CPU goes, by kind of process: `python -m tests.cpu_by_process -- <command>` runs the command
(`.venv/bin/python -m pytest -n 2 --dist loadgroup` for the suite), reads every process's CPU time from /proc every
0.25 s while it runs, and prints the core-seconds each kind of process used (a Ray actor by its class, a Ray worker
before its task as `ray::IDLE`, a Prefect server as `uvicorn`, ...) and how many there were, beside the whole machine's
busy core-seconds from /proc/stat. Run it on an otherwise idle machine: every process on it is counted, and one that
lives under 0.25 s is missed. Not a test (pytest collects only test_*.py); docs/performance.md#the-test-suite has what
it measured."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
# command-line fragments that name a kind of process, first match wins
KINDS = (
    "setup_worker", "default_worker", "ray-dashboard-", "multiprocessing", "raylet", "gcs_server", "dashboard/agent", "dashboard.py", "runtime_env/agent",
    "log_monitor", "monitor.py", "uvicorn", "prefect.engine", "prefect", "mlflow", "chromium", "postgres", "moto",
    "pytest", "trainflow",
)  # fmt: skip


STARTING = ("setup_worker", "default_worker", "ray::IDLE")


def _read(pid: str) -> tuple[float, int, str] | None:
    """(CPU seconds, start tick, command line) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[19]), command


def kind(command: str) -> str:
    """A process's kind from its command line (a Ray worker's is its task or actor: `ray::TrainController.run`)."""
    if command.startswith("ray::"):
        return "ray::" + re.split(r"[ .(:]", command[5:])[0]
    return next((k for k in KINDS if k in command), command[:60])


def _busy() -> float:
    """The machine's busy core-seconds so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def sample(command: list[str], every_s: float = 0.25) -> tuple[int, float, dict[str, tuple[float, int]]]:
    """Run command, sampling; (its exit status, the machine's busy core-s meanwhile, kind -> (core-s, processes))."""
    seen: dict[tuple[str, int], list] = {}  # (pid, start) -> [cpu at first sight, cpu now, the kind it worked as]

    def scan() -> None:
        for pid in os.listdir("/proc"):
            got = pid.isdigit() and _read(pid)
            if not got:
                continue
            cpu, start, cmd = got
            now = kind(cmd)
            entry = seen.setdefault((pid, start), [cpu, cpu, now])
            entry[1] = cpu
            # a Ray worker process (setup_worker, then default_worker, then ray::IDLE) is counted as the first task
            # or actor it runs
            if entry[2] in STARTING and now != "ray::IDLE":
                entry[2] = now

    scan()
    for entry in seen.values():  # what ran before the command is not the command's
        entry[0] = entry[1]
    busy = _busy()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(every_s)
        scan()
    scan()
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for first, last, name in seen.values():
        if last > first:
            totals[name][0] += last - first
            totals[name][1] += 1
    return proc.returncode, _busy() - busy, {k: (v[0], v[1]) for k, v in totals.items()}


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    started = time.monotonic()
    code, busy, totals = sample(command)
    print(f"exit {code}, {time.monotonic() - started:.0f} s, machine busy {busy:.0f} core-s; by kind of process:")
    for name, (seconds, count) in sorted(totals.items(), key=lambda item: -item[1][0])[:40]:
        print(f"{seconds:9.1f} core-s {count:5d}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
