"""Numbers the config's descriptions state and the trainer applies, owned here (the ground floor both read): the
networks' auto budget, the time budget's shortest run and auto floor, the hang watchdog's auto rule."""

# a network's epochs and batch_size, train.early_stopping.patience: auto (trainer/budget.py)
TARGET_STEPS = 4000  # optimizer steps per worker an auto budget aims at
MIN_BATCH, MAX_BATCH = 16, 512
MIN_AUTO_EPOCHS, MAX_AUTO_EPOCHS = 10, 300
ROWS_PER_STEP = 32  # auto batch: about this many steps per epoch before the batch-size cap
MIN_PATIENCE, PATIENCE_SHARE = 10, 10  # auto patience: max(MIN_PATIENCE, epochs / PATIENCE_SHARE)

# scaling.local_mode auto: the most non-test rows of a table whose one-worker fits train in the train task's process
LOCAL_MAX_ROWS = 100_000

# train.time_limit
MIN_RUN_S = 15.0  # a family whose runs would get less than this each is left out (a Ray Train start alone takes ~11 s)
AUTO_FLOOR_S = 300.0  # auto: training takes at most max(twice the first family's time, this)

# failure.hang_timeout_s
HANG_FIRST_S = 120.0  # before the first progress mark (start-up, the first block of a large table): at least this
HANG_MIN_S = 60.0  # auto: never shorter than this
HANG_FACTOR = 20.0  # auto: this many times the longest gap between progress marks seen so far

# ray.temp_dir: the longest path Ray forms under a local Ray's folder is <folder>/ray/session_<date>_<time>_<us>_<pid>/
# sockets/plasma_store.<n> (ray/_private/node.py); a Unix socket's path holds at most 107 bytes on Linux (103 on macOS)
# and Ray fails deep inside ray.init past that
SOCKET_PATH_MAX = 103 if __import__("sys").platform == "darwin" else 107
RAY_SOCKET_TAIL = len("/ray/session_2026-12-01_21-17-22_123456_") + 7 + len("/sockets/plasma_store.99")
RAY_FOLDER_MAX = SOCKET_PATH_MAX - RAY_SOCKET_TAIL  # bytes a local Ray's own folder's path may have


def ray_folder_refusal(path: str) -> str | None:
    """Why Ray's socket paths would not fit under the folder path (None when they do)."""
    size = len(path.encode())
    if size <= RAY_FOLDER_MAX:
        return None
    return (
        f"{path} is {size} bytes long, too long for the Unix socket paths Ray makes under it (at most "
        f"{SOCKET_PATH_MAX} bytes, {RAY_SOCKET_TAIL} of them Ray's own): name a folder of at most {RAY_FOLDER_MAX} bytes"
    )
