"""The GPU record run's log: every run and probe the kit reports (helpers.runner.report), one JSON
line each, appended to the file ``KIT_BENCH_LOG`` names. tools/gpu_record_run.sh sets both
``KIT_REPORT_TO=tools.run_log:append`` and ``KIT_BENCH_LOG``; docs/gpu_runs.md is written from these
files, since nbval keeps no notebook output."""

from __future__ import annotations

import json
import os

LOG_ENV = "KIT_BENCH_LOG"


def append(record: dict) -> None:
    """Append ``record`` as one JSON line to the file ``KIT_BENCH_LOG`` names."""
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(json.dumps(record) + "\n")
