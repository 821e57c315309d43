"""One-process distributed setup for notebooks: what a launcher (torchrun, ``deepspeed``) would set
(MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE), free ports probed rather than assumed, and a
round trip that proves a group starts.
"""

from __future__ import annotations

import os
import socket

from helpers.env import KitSetupError


def free_port(start: int | None = None, tries: int = 200, host: str = "") -> int:
    """A port nothing listens on, probed by binding to it: one the OS picks (``start`` None), else
    the first free one from ``start`` on.

    The OS's pick is random among its ephemeral ports, so two processes that look for a port at the
    same moment do not both take 29500 (seen on a GPU machine running notebooks side by side). The
    probe binds the wildcard address: torch's TCPStore listens on all addresses (IPv6 dual stack), so
    a port free on 127.0.0.1 alone can still be taken for it.
    """
    if start is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    for port in range(start, start + tries):
        if _port_free(port, host):
            return port
    raise KitSetupError(f"no free port in {start}..{start + tries - 1} on {host}: set MASTER_PORT to a free one")


_DIST_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def _port_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _launched() -> bool:
    """True when a real launcher (torchrun, the deepspeed launcher) started this process."""
    # Not LOCAL_WORLD_SIZE: accelerate sets it in a plain process too.
    return "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get("WORLD_SIZE", "1") != "1"


def setup_single_process_dist(port: int | None = None) -> dict[str, str]:
    """Set what a launcher would (MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE) for one process.

    Variables already set (by a launcher, or an earlier call) are kept, so calling twice is safe
    and a real launcher wins. The port is probed, not assumed free: a MASTER_PORT inherited from a
    parent process whose port is now taken (and not by this process's own group) is replaced.
    """
    defaults = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    current = os.environ.get("MASTER_PORT")
    if current is None or (not _launched() and not _group_started() and not _port_free(int(current))):
        os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    return {k: os.environ[k] for k in _DIST_KEYS}


def _group_started() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


def dist_roundtrip() -> bool:
    """Start a one-process gloo group on the variables from setup_single_process_dist, all-reduce, stop.

    Proves the port is usable before DeepSpeed needs it. Leaves no group behind.
    """
    import torch
    import torch.distributed as dist

    setup_single_process_dist()
    if dist.is_initialized():  # DeepSpeed already started one in this kernel: use it
        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item() == int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    try:
        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item() == int(os.environ["WORLD_SIZE"])
    finally:
        dist.destroy_process_group()
