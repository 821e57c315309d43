"""Notebook 02's narrative over :mod:`helpers.doctor`: the claims it asserts about the ops this run
built and exercised, the facts its checked output compares, and its closing lines."""

from __future__ import annotations

from helpers import claims, show
from helpers.doctor import READY, Facts, OpStatus, build_note


def checks(facts: Facts, statuses: list[OpStatus]) -> list[tuple[str, bool]]:
    """The claims notebook 02 asserts, each measured in this run and able to fail: CPU Adam builds,
    loads and steps like torch's AdamW; where libaio is installed, async_io round-trips a tensor
    through a file; on a GPU FusedAdam loads; every failed build carries a reason."""
    ops = {s.name: s for s in statuses}

    def works(name: str) -> bool:
        s = ops.get(name)
        return bool(s and s.loads and s.works)

    def error(name: str) -> str:
        s = ops.get(name)
        if not s:
            return "not built"
        if not s.loads:
            return "did not load" + (f": {show.clip(s.why, 160)}" if s.why else "")
        if not s.works:
            return show.clip(s.why, 160) or "its exercise did not run"
        return f"error {s.works_error:.1e}"

    out = [(f"CPU Adam (every offload notebook needs it) builds, loads and steps like torch's AdamW "
            f"({error('cpu_adam')})", works("cpu_adam"))]
    if facts.libaio:
        out.append((f"libaio is installed, so async_io builds and round-trips 1 MiB through a file "
                    f"({error('async_io')})", works("async_io")))
    if facts.has_gpu:
        out.append(("FusedAdam (fp16/bf16 training on the GPU) builds and loads",
                    bool(ops.get("fused_adam") and ops["fused_adam"].loads)))
    failed = [s for s in statuses if s.loads is False]
    out.append((f"every failed build carries a reason ({len(failed) or 'none'} failed)", all(s.why for s in failed)))
    return out


def summary(facts: Facts, statuses: list[OpStatus], claims_held: list[tuple[str, bool]]) -> str:
    """Facts that read the same on a CPU and on a T4 (what notebook 02 compares with nbval)."""
    ops = {s.name: s for s in statuses}
    aio = ops.get("async_io")
    return "\n".join([
        f"cpu_adam loads and steps like AdamW: {bool(ops.get('cpu_adam') and ops['cpu_adam'].works)}",
        f"async_io works wherever libaio is installed: {not facts.libaio or bool(aio and aio.works)}",
        f"all checks held: {claims.every(held for _, held in claims_held)}",
    ])


def takeaways(facts: Facts, statuses: list[OpStatus], rows: list[tuple[str, str, str]]) -> list[str]:
    """Notebook 02's summary: what was built and what is ready, each figure from this run."""
    built = [f"{s.name} {s.seconds:.0f} s ({build_note(s)})" for s in statuses
             if s.loads and s.seconds is not None]
    ready = [c for c, status, _ in rows if status == READY]
    missing = [f"{c} ({status}: {show.clip(why, 60)})" for c, status, why in rows if status != READY]
    cpu_adam = next((s for s in statuses if s.name == "cpu_adam"), None)
    return [
        "Ops built and loaded in fresh processes: " + (", ".join(built) or "none") + ". A compiled op is "
        "cached, so the next notebooks load it in seconds.",
        f"Ready here: {', '.join(ready) or 'nothing'}.",
        "Not ready: " + ("; ".join(missing) or "nothing") + ".",
        f"CPU Adam matched torch's AdamW to {cpu_adam.works_error:.1e} after three steps." if cpu_adam
        and cpu_adam.works_error is not None else "CPU Adam was not exercised.",
        "Next: 03 · config builder: these capabilities become a DeepSpeed config, checked and sized.",
    ]
