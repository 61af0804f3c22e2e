"""The CLI's background Ray start, in a fresh interpreter (as `trainflow retrain` runs it)."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import ray
    from trainflow.runtime import ensure_ray, start_ray_in_background

    thread = start_ray_in_background()
    ensure_ray()  # what every task does: waits for the background start, then a no-op
    # a local Ray's GCS and raylet die with the thread that forked them (PR_SET_PDEATHSIG), so the
    # starting thread must outlive the start; join returns at once if it has ended
    thread.join(timeout=1)
    assert thread.is_alive(), "the thread that started Ray has ended"
    print("answer", ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60))

    @ray.remote
    def paced():  # the job's worker_process_setup_hook ran in this worker (trainflow/pacing.py)
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
        return getattr(StreamingExecutor._scheduling_loop_step, "_trainflow_paced", False)

    print("paced", ray.get(paced.remote(), timeout=60))
    ray.shutdown()
    """
)


def test_ray_started_in_the_background_keeps_working():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "answer 42" in proc.stdout
    assert "paced True" in proc.stdout
    assert "SIGTERM handler is not set" not in proc.stderr  # the CLI installs it from the main thread
