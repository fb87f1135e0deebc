"""Who holds a run: its holder (host, pid and process start) and whether it still holds it.

A holder holds a run while its lease is current: one that stopped heartbeating (killed,
paused past its lease, a machine gone) holds nothing, and a process that wakes to find
its run taken over stops without writing. On this machine we can also ask the OS, so a
killed run is taken over at once — and the process start time recorded in the holder
tells a live holder from another process that got its PID later (after a reboot).
"""

from __future__ import annotations

import functools
import os
import socket

from deepline_cli.store.records import RunRecord
from deepline_cli.store.roles import Store


def holder_id() -> str:
    """`host:pid`, and `:boot-start` where the OS tells when the process started."""
    token = _start_token(os.getpid())
    base = f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}:{token}" if token else base


def holder_words(holder: str | None) -> str:
    """A holder as a person reads it: `pid 4242 on build-7` (the process start token,
    there to tell a reused PID, is left out)."""
    if not holder:
        return ""
    host, pid, _ = _parse(holder)
    return f"pid {pid} on {host}" if pid is not None else holder


def holder_alive(record: RunRecord, now: float) -> bool:
    """Does a live process still hold this run?"""
    if not record.holder or record.status not in ("running", "queued"):
        return False
    if (record.lease_expires_at or 0.0) <= now:
        return False
    return not holder_gone_here(record)  # elsewhere: held while the lease is current


def holder_stale(record: RunRecord, now: float) -> bool:
    """A run the store says is running that no live process holds (killed, or its lease out)."""
    return record.status == "running" and not holder_alive(record, now)


def _running(pid: int, token: str | None) -> bool:
    """Is the process `pid` (started as `token` says, where it was recorded) running?"""
    if token is not None and token != _start_token(pid):
        return False  # the PID belongs to another process now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _process_exists(pid)


def release_if_dead(store: Store, run_id: str) -> bool:
    """A run whose process on this machine is gone (killed) gives up the calls it held, as
    a resume of it would: another run wanting the same call takes it over at once, not once
    its lease expires. Only the OS's word counts: a live holder whose run lease lapsed (a
    store hiccup held its heartbeat) or one on another machine keeps them until their own
    leases expire. False when nothing was given up."""
    record = store.runs.get_run(run_id)
    if record is None or record.status != "running" or not holder_gone_here(record):
        return False
    return store.receipts.expire_run_receipts(run_id, before_attempt=record.attempt + 1) > 0


def holder_gone_here(record: RunRecord) -> bool:
    """Is the run's holder a process of this machine that is gone (by the OS, not a lease)?"""
    if not record.holder:
        return False
    host, pid, token = _parse(record.holder)
    if host != socket.gethostname() or pid is None or pid == os.getpid():
        return False
    return not _running(pid, token)


def _parse(holder: str) -> tuple[str, int | None, str | None]:
    """`host:pid` or `host:pid:token` → (host, pid, token)."""
    head, _, last = holder.rpartition(":")
    if last.isdigit():
        return head, int(last), None
    host, _, pid = head.rpartition(":")
    if pid.isdigit():
        return host, int(pid), last
    return holder, None, None


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()[:8]
    except OSError:
        return ""


def _start_token(pid: int) -> str | None:
    """`boot-starttime` for a process (Linux), None where the OS does not say."""
    stat = _stat(pid)
    boot = _boot_id()
    if stat is None or not boot:
        return None
    return f"{boot}-{stat[19]}"  # field 22 of /proc/PID/stat: start time, in clock ticks since boot


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_exists(pid: int) -> bool:
    # A zombie (killed, not yet reaped by its parent) still answers kill(0); it holds nothing.
    stat = _stat(pid)
    return stat is None or stat[0] != "Z"
