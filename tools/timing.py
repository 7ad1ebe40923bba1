"""The tools' one timer: the median of repeated calls after a warm-up call."""

import statistics
import time
from typing import Callable


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Milliseconds a call takes, median of `repeats` after one warm-up (the first call pays for caches and
    lazy setup that decoding pays once)."""
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)
