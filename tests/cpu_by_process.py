"""Where a command's CPU goes, by kind of process: `python -m tests.cpu_by_process -- <command>` runs the command
(`.venv/bin/python -m pytest -n 2 --dist loadgroup` for the suite), reads every process's CPU time from /proc every
0.25 s while it runs, and prints the core-seconds each kind of process used (a Ray actor by its class, a Ray worker
before its task as `ray::IDLE`, a Prefect server as `uvicorn`, ...) and how many there were, beside the whole machine's
busy core-seconds from /proc/stat. Run it on an otherwise idle machine: every process on it is counted, and one that
lives under 0.25 s is missed. Not a test (pytest collects only test_*.py); docs/performance.md#the-test-suite has what
it measured.

`--by-test` (the command a pytest run): each pytest process (an xdist worker) loads this module as a plugin and names
the test it runs in a file of its own; each sample's CPU of a process goes to the test its nearest pytest ancestor runs
(its CLI subprocesses, its Ray's raylet and workers, the servers it started), and the tests that cost the most CPU are
printed with the kinds of process that spent it, each the kind the process had when it spent it: `default_worker` and
`setup_worker` there are Ray worker processes starting, before their first task or actor (the totals above count a
process as the first task or actor it runs). A process whose parent is gone (reparented to init) is "(no test)"."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")
# command-line fragments that name a kind of process, first match wins
KINDS = (
    "setup_worker", "default_worker", "ray-dashboard-", "multiprocessing", "raylet", "gcs_server", "dashboard/agent", "dashboard.py", "runtime_env/agent",
    "log_monitor", "monitor.py", "uvicorn", "prefect.engine", "prefect", "mlflow", "chromium", "postgres", "moto",
    "pytest", "trainflow",
)  # fmt: skip


STARTING = ("setup_worker", "default_worker", "ray::IDLE")


MARKS = "CPU_BY_TEST_DIR"  # the folder where each pytest process names the test it runs (--by-test)


def _read(pid: str) -> tuple[float, int, str, str] | None:
    """(CPU seconds, start tick, command line, parent pid) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[19]), command, fields[1]


def kind(command: str) -> str:
    """A process's kind from its command line (a Ray worker's is its task or actor: `ray::TrainController.run`)."""
    if command.startswith("ray::"):
        return "ray::" + re.split(r"[ .(:]", command[5:])[0]
    if "import sys;exec(eval(sys.stdin" in command:  # execnet's bootstrap: a pytest-xdist worker
        return "xdist worker"
    return next((k for k in KINDS if k in command), command[:60])


def _busy() -> float:
    """The machine's busy core-seconds so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def sample(
    command: list[str], every_s: float = 0.25, marks: str | None = None
) -> tuple[int, float, dict[str, tuple[float, int]], dict[str, collections.Counter]]:
    """Run command, sampling; (its exit status, the machine's busy core-s meanwhile, kind -> (core-s, processes),
    test -> its core-s by kind: with marks, the folder where the pytest processes name their tests, else empty)."""
    seen: dict[tuple[str, int], list] = {}  # (pid, start) -> [cpu at first sight, cpu now, the kind it worked as]
    by_test: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def scan(attribute: bool) -> None:
        parents, deltas = {}, []
        tests = {name: _test_of(marks, name) for name in os.listdir(marks)} if marks else {}
        for pid in os.listdir("/proc"):
            got = pid.isdigit() and _read(pid)
            if not got:
                continue
            cpu, start, cmd, parents[pid] = got
            now = kind(cmd)
            entry = seen.setdefault((pid, start), [cpu, cpu, now])
            deltas.append((pid, cpu - entry[1], entry))
            entry[1] = cpu
            # a Ray worker process (setup_worker, then default_worker, then ray::IDLE) is counted as the first task
            # or actor it runs
            if entry[2] in STARTING and now != "ray::IDLE":
                entry[2] = now
        if attribute and marks:
            for pid, spent, entry in deltas:
                if spent > 0:
                    by_test[_owner(pid, parents, tests)][entry[2]] += spent

    scan(False)
    for entry in seen.values():  # what ran before the command is not the command's
        entry[0] = entry[1]
    busy = _busy()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(every_s)
        scan(True)
    scan(True)
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for first, last, name in seen.values():
        if last > first:
            totals[name][0] += last - first
            totals[name][1] += 1
    return proc.returncode, _busy() - busy, {k: (v[0], v[1]) for k, v in totals.items()}, by_test


def _test_of(marks: str, pid: str) -> str:
    try:
        with open(os.path.join(marks, pid)) as f:
            return f.read() or "(between tests)"
    except OSError:
        return "(between tests)"


def _owner(pid: str, parents: dict[str, str], tests: dict[str, str]) -> str:
    """The test that the nearest pytest ancestor of pid (or pid itself) runs."""
    for _ in range(64):
        if pid in tests:
            return tests[pid]
        pid = parents.get(pid, "0")
        if pid in ("0", "1"):
            break
    return "(no test)"


def pytest_runtest_logstart(nodeid, location):
    """(As a pytest plugin, --by-test.) This process's current test, named where the sampler reads it."""
    _mark(nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _mark("")


def _mark(nodeid: str) -> None:
    folder = os.environ.get(MARKS)
    if folder:
        path = os.path.join(folder, str(os.getpid()))
        with open(path + ".tmp", "w") as f:
            f.write(nodeid)
        os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    by_test = "--by-test" in argv[: argv.index("--")] if "--" in argv else False
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cpu-by-test-") as marks:
        if by_test:
            os.environ[MARKS] = marks
            command = [*command, "-p", "tests.cpu_by_process"]
        code, busy, totals, tests = sample(command, marks=marks if by_test else None)
    print(f"exit {code}, {time.monotonic() - started:.0f} s, machine busy {busy:.0f} core-s; by kind of process:")
    for name, (seconds, count) in sorted(totals.items(), key=lambda item: -item[1][0])[:40]:
        print(f"{seconds:9.1f} core-s {count:5d}  {name}")
    if tests:
        print("by test (its pytest process and every process under it), the costliest first:")
        for test, spent in sorted(tests.items(), key=lambda item: -sum(item[1].values()))[:40]:
            top = ", ".join(f"{name} {seconds:.0f}" for name, seconds in spent.most_common(4))
            print(f"{sum(spent.values()):9.1f} core-s  {test}  ({top})")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
