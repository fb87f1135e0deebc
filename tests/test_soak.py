"""A short soak in the suite: random SIGKILL / SIGSTOP / SIGTERM on a real run, then
billed == distinct calls, no same-key re-send unless its first sender was killed,
terminated or taken over, nothing sent by a process after it was taken over, and the
credits the run reports are every call's once (tests/soak.py; the 50-fault figures are
in BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import Soak

pytestmark = pytest.mark.process


def test_a_run_under_random_faults_bills_every_call_once(tmp_path: Path, store_url: str) -> None:
    result = Soak(store=store_url, rows=300, events=8, seed=7, latency_s=0.25, work=tmp_path).run()

    assert result["faults"] >= 4, result  # the run outlasted several faults
    assert result["exit"] == 0, result
    assert result["billed"] == result["distinct_calls"] == result["calls_made"], result
    assert result["calls_under_two_keys"] == 0, result
    assert result["resends_without_a_fault"] == 0, result
    assert result["sent_after_taken_over"] == 0, result
    assert result["credits_reported"] == result["credits_expected"], result
    assert result["ok"], result
