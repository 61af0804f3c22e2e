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
    from trainflow.runtime import _OWN_TEMP, ensure_ray, start_ray_in_background, stop_ray

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
    def paced():  # the job's worker_process_setup_hook ran in this worker (trainflow/pacing.py): it wraps Ray
        import sys  # Data's loop when the worker imports it, and costs a worker that never does no import

        before = "ray.data._internal.execution.streaming_executor" in sys.modules
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
        return before, getattr(StreamingExecutor._scheduling_loop_step, "_trainflow_paced", False)

    print("paced", ray.get(paced.remote(), timeout=60))
    env = ray.get(ray.remote(lambda: (os.environ.get("TF_WORKER_TOKEN"), os.environ.get("TF_JOB_TOKEN"))).remote())
    print("env", env == (S, S + "-job"), os.environ.get("TF_WORKER_TOKEN"))
    [root] = _OWN_TEMP
    print("private", oct(stat.S_IMODE(os.stat(root).st_mode)), os.listdir(root))
    print("grep", subprocess.run(["grep", "-rl", S, root], capture_output=True, text=True).stdout.split())
    stop_ray()
    print("removed", not os.path.exists(root))
    """
)


def test_ray_started_in_the_background_keeps_working():
    # A dead cluster's address left in Ray's temp dir (a `ray start` or ray.cluster_utils head that was
    # killed) must not be joined: with no address configured trainflow starts its own Ray. The temp dir is
    # this test's own (short: Ray's socket paths must fit 107 characters).
    ray_tmp = tempfile.mkdtemp(prefix="tfray", dir="/tmp")
    try:
        stale = Path(ray_tmp, "ray", "ray_current_cluster")
        stale.parent.mkdir()
        stale.write_text("127.0.0.1:9")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
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
        assert "SIGTERM handler is not set" not in proc.stderr  # the CLI installs it from the main thread
        assert stale.read_text() == "127.0.0.1:9"  # not trainflow's file: left as it was
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
