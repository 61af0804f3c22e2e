"""The CLI's background Ray start, in a fresh interpreter (as `trainflow retrain` runs it)."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import os, stat, subprocess
    import ray
    from trainflow.run.runtime import _OWN_TEMP, ensure_ray, start_ray_in_background, stop_ray

    S = "s3ntinel-9f1c2e"  # scaling.env_vars and ray.runtime_env's env_vars: the workers get them, no Ray log does
    thread = start_ray_in_background(runtime_env={"env_vars": {"TF_JOB_TOKEN": S + "-job"}},
                                     worker_env={"TF_WORKER_TOKEN": S})
    ensure_ray()  # what every task does: waits for the background start, then a no-op
    # a local Ray's GCS and raylet die with the thread that forked them (PR_SET_PDEATHSIG), so the
    # starting thread must outlive the start; join returns at once if it has ended
    thread.join(timeout=1)
    assert thread.is_alive(), "the thread that started Ray has ended"
    print("answer", ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60))

    @ray.remote
    def paced():  # Ray's worker_process_setup_hook ran in this worker (trainflow/pacing.py): it wraps Ray
        import sys  # Data's loop when the worker imports it, and costs a worker that never does no import

        before = "ray.data._internal.execution.streaming_executor" in sys.modules
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
        return before, getattr(StreamingExecutor._scheduling_loop_step, "_trainflow_paced", False)

    print("paced", ray.get(paced.remote(), timeout=60))
    env = ray.get(ray.remote(lambda: (os.environ.get("TF_WORKER_TOKEN"), os.environ.get("TF_JOB_TOKEN"))).remote())
    print("env", env == (S, S + "-job"), os.environ.get("TF_WORKER_TOKEN"))
    [root] = _OWN_TEMP
    print("private", oct(stat.S_IMODE(os.stat(root).st_mode)), os.listdir(root))
    sockets = os.path.join(root, "ray", "session_latest", "sockets")
    print("sockets", os.path.dirname(root), max(len(os.path.realpath(os.path.join(sockets, f))) for f in os.listdir(sockets)))
    print("grep", subprocess.run(["grep", "-rl", S, root], capture_output=True, text=True).stdout.split())
    stop_ray()
    print("removed", not os.path.exists(root))
    """
)


def _folder_of_length(under: str, length: int) -> str:
    """A new folder whose path has exactly length characters (a TMPDIR of that length)."""
    path = Path(under, "t" * (length - len(under) - 1))
    path.mkdir()
    return str(path)


def test_the_private_ray_folder_fits_socket_paths_for_any_tmpdir():
    """A TMPDIR of 19, 35 or 60 characters (a job's `mktemp -d`, /scratch/<user>/tmp): the local Ray's folder is
    placed where the longest socket path Ray makes under it fits 107 bytes; a ray.temp_dir too long for it is refused
    when the config loads, naming the key and the limit."""
    from trainflow.limits import RAY_SOCKET_TAIL

    base = tempfile.mkdtemp(prefix="tf", dir="/tmp")
    try:
        probe = "import tempfile, trainflow.run.runtime as r; print(r.private_temp_dir(None)); r.remove_own_temp()"
        for length in (19, 35, 60):
            tmpdir = _folder_of_length(base, length)
            env = dict(os.environ, TMPDIR=tmpdir)
            done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr[-2000:]
            folder = done.stdout.split()[-1]
            assert len(folder) + RAY_SOCKET_TAIL <= 107, (length, folder)
            assert folder.startswith(tmpdir if len(tmpdir) <= 13 else "/tmp/trainflow-ray-"), (length, folder)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    from pydantic import ValidationError

    from trainflow.config.training import RaySection

    try:
        RaySection(temp_dir="/tmp/" + "s" * 40)
    except ValidationError as exc:
        said = str(exc)
    assert "temp_dir" in said and "at most 107 bytes" in said and "at most 36 bytes" in said, said


def test_ray_started_in_the_background_keeps_working():
    # A dead cluster's address left in Ray's temp dir (a `ray start` or ray.cluster_utils head that was
    # killed) must not be joined: with no address configured trainflow starts its own Ray. The temp dir is
    # this test's own (short: Ray's socket paths must fit 107 characters).
    ray_tmp = tempfile.mkdtemp(prefix="tfray", dir="/tmp")
    # a TMPDIR as `mktemp -d` makes it (19 characters): the private folder goes where Ray's sockets fit
    tmpdir = _folder_of_length(tempfile.mkdtemp(prefix="tf", dir="/tmp"), 19)
    try:
        stale = Path(ray_tmp, "ray", "ray_current_cluster")
        stale.parent.mkdir()
        stale.write_text("127.0.0.1:9")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp, "TMPDIR": tmpdir}
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "answer 42" in proc.stdout
        assert "paced (False, True)" in proc.stdout, proc.stdout
        # the user's env vars reach the workers through the local Ray's environment (never this driver's after the
        # start, never a Ray log: its session folder, private to the user, holds no file with the value), and the
        # folder goes when Ray stops
        assert "env True None" in proc.stdout and "private 0o700 ['ray']" in proc.stdout, proc.stdout
        assert "grep []" in proc.stdout and "removed True" in proc.stdout, proc.stdout
        [(parent, longest)] = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("sockets ")]
        assert parent == "/tmp" and int(longest) <= 107, proc.stdout
        assert "SIGTERM handler is not set" not in proc.stderr  # the CLI installs it from the main thread
        assert stale.read_text() == "127.0.0.1:9"  # not trainflow's file: left as it was
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(os.path.dirname(tmpdir), ignore_errors=True)
