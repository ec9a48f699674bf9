"""What the drift watch's outage and restart tests share: one endpoint at concurrency 4, held
to a tight sweep level of it (20 items/s, 0.2 s a request)."""

from __future__ import annotations

from calibrate.state.calibrated import Calibrated

LABEL = "http://127.0.0.1:8000/v1"
C = 4
FAST, SLOW = 0.2, 0.6  # a request's seconds: as calibrated, and 3× slower
# a sweep level at concurrency 4: 20 items/s (its 3 repeats 19–21), 0.2 s a request
CAL = Calibrated(
    "sweep",
    "20261205T000000Z-sweep-ab12cd",
    C,
    C,
    20.0,
    19.0,
    21.0,
    3,
    items=600,
    errors=0,
    latency_p50_s=0.2,
    latency_p99_s=0.26,
    input_tokens_mean=24.0,
    output_tokens_mean=30.0,
    ttft_p50_s=0.026,
    tpot_p50_s=0.006,
    workload="the fixed prompt (24 input tokens)",
)
