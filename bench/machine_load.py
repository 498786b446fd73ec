"""The machine's load, for benches that compare engines only on a quiet machine."""
import os
import time


def load_1min() -> float:
    return round(os.getloadavg()[0], 2)


def wait_quiet(limit: float, timeout: float) -> float:
    """Waits up to `timeout` s for the 1-minute load average to fall below `limit`."""
    deadline = time.monotonic() + timeout
    while load_1min() >= limit and time.monotonic() < deadline:
        time.sleep(5)
    return load_1min()
