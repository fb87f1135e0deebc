"""Who holds a run: its holder (host and pid) and whether that process still lives."""

from __future__ import annotations

import os
import socket

from deepline_cli.store.base import RunRecord


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_alive(record: RunRecord, now: float) -> bool:
    """Is the process holding this run still alive?

    On this machine we can ask the OS (a killed run is taken over at once); a holder
    elsewhere is alive as long as its lease has not expired.
    """
    if not record.holder or record.status not in ("running", "queued"):
        return False
    host, _, pid_text = record.holder.rpartition(":")
    if host == socket.gethostname() and pid_text.isdigit():
        pid = int(pid_text)
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return (record.lease_expires_at or 0.0) > now or _process_exists(pid)
    return (record.lease_expires_at or 0.0) > now


def _process_exists(pid: int) -> bool:
    # A zombie (killed, not yet reaped by its parent) still answers kill(0); it holds nothing.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
