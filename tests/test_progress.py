"""Progress reports reach the fit that made them: one queue actor per Ray session serves every fit of the process."""

from __future__ import annotations

import threading

import pytest

from trainflow.trainer import progress


@pytest.mark.usefixtures("ray_local")
def test_fits_side_by_side_get_their_own_reports_through_one_queue_and_none_is_lost_at_the_end():
    got: dict[str, list[int]] = {"a": [], "b": []}
    queues = []

    def fit(name: str, reports: int, started: threading.Barrier) -> None:
        with progress.watch_progress(lambda m: got[name].append(m["epoch"])) as callback:
            queues.append(callback.queue)
            started.wait(10)
            for epoch in range(reports):  # what Ray Train's controller calls after each report
                callback.after_report(None, [{"epoch": epoch, "val_loss": 1.0 / (epoch + 1)}, {"epoch": epoch}], None)
        # the block has ended: every report it queued has been passed on, none of the other fit's
        assert got[name] == list(range(reports))

    started = threading.Barrier(2)
    threads = [threading.Thread(target=fit, args=("a", 40, started)), threading.Thread(target=fit, args=("b", 25, started))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {"a": list(range(40)), "b": list(range(25))}
    assert queues[0].actor == queues[1].actor  # one actor process for both fits

    # a later fit reuses it; a failing on_report never fails the fit, and the thread ends with the last block
    def broken(metrics):
        raise RuntimeError("printer gone")

    with progress.watch_progress(broken) as callback:
        callback.after_report(None, [{"epoch": 0}], None)
        assert callback.queue.actor == queues[0].actor
    hub = progress._current_hub(0.5)
    hub_thread = [t for t in threading.enumerate() if t.name == "trainflow-progress"]
    for t in hub_thread:
        t.join(5)
    assert not hub.draining and not hub.routes
