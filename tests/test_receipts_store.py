"""Receipts through real plays (`ReceiptBook`), and the pure claim decision.

The store's side of the receipt state machine (claims, leases, takeover, settlement,
queries) is tests/test_store_contract.py, run on every backend. Play tests here run the
real `Runner` (it calls asyncio.run itself, so they are plain sync tests); their local
tools count invocations in `CALLS` below, which the play files import, so counts survive
the play module being re-imported on every run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepline_cli.store.claims import decide_claim
from deepline_cli.store.records import Receipt, ReceiptQuery
from deepline_cli.store.sqlite import SQLiteStore
from tests.helpers import resume_run, run_play
from tests.test_store_contract import T0, mk_claim

# Invocations of the play files' local tools: one entry (the tool id) per call.
CALLS: list[str] = []
# Idempotency keys seen by tools that take `(input, call)`.
KEYS: list[str] = []


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "receipts.db"


# --- the claim decision -------------------------------------------------------------------


def test_decide_claim_treats_a_skipped_receipt_as_free() -> None:
    skipped = Receipt(key="k", kind="tool", label="", tool=None, status="skipped", run_id="r1", attempt=1)
    assert decide_claim(skipped, mk_claim("k", run_id="r2"), T0) == "claimed"
    assert decide_claim(None, mk_claim("k"), T0) == "claimed"


# --- ReceiptBook through real plays -------------------------------------------------------


def write_play(tmp_path: Path, body: str, name: str = "play.py") -> Path:
    header = """\
        import asyncio

        from deepline_cli import ProviderTransientError, play, tool
        from tests.test_receipts_store import CALLS, KEYS
        """
    path = tmp_path / name
    path.write_text(textwrap.dedent(header) + textwrap.dedent(body))
    return path


def receipts_of(store_file: Path, **query: Any) -> list[Receipt]:
    opened = SQLiteStore(store_file)
    try:
        return opened.receipts.query_receipts(ReceiptQuery(**query))
    finally:
        opened.close()


def test_identical_concurrent_calls_share_one_invocation_and_a_rerun_pays_nothing(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.gather.lookup"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}", credits=1)
        async def lookup(input):
            CALLS.append("{tool_id}")
            return {{"echo": input["q"]}}

        @play("gather")
        async def gather(ctx, input):
            same = await asyncio.gather(
                *(ctx.tools.execute(f"same-{{i}}", "{tool_id}", {{"q": "x"}}) for i in range(20))
            )
            seq = [await ctx.tools.execute(f"seq-{{i}}", "{tool_id}", {{"q": i}}) for i in range(3)]
            return {{
                "same": [r.execution for r in same],
                "outputs": [r.output for r in same],
                "seq": [r.execution for r in seq],
                "seq_outputs": [r.output for r in seq],
            }}
        """,
    )

    first = run_play(play_file, db)

    assert first.status == "completed", first.error
    assert CALLS.count(tool_id) == 4
    assert sorted(first.output["same"]) == ["in_flight"] * 19 + ["live"]
    assert first.output["outputs"] == [{"echo": "x"}] * 20
    assert first.output["seq"] == ["live"] * 3
    assert first.stats["tools"][tool_id]["live"] == 4
    assert first.stats["tools"][tool_id]["credits"] == 4

    second = run_play(play_file, db)

    assert second.status == "completed", second.error
    assert second.run_id != first.run_id
    assert CALLS.count(tool_id) == 4
    assert second.output["seq"] == ["receipt"] * 3
    assert second.output["seq_outputs"] == [{"echo": 0}, {"echo": 1}, {"echo": 2}]
    assert sorted(second.output["same"]) == ["in_flight"] * 19 + ["receipt"]
    assert second.output["outputs"] == [{"echo": "x"}] * 20
    assert second.stats["tools"][tool_id]["live"] == 0
    assert second.stats["tools"][tool_id]["credits"] == 0
    # `receipts inspect --run` of the rerun lists the four receipts it reused.
    used = receipts_of(db, run_id=second.run_id)
    assert len(used) == 4
    assert {r.run_id for r in used} == {first.run_id}
    assert {r.status for r in used} == {"completed"}


def test_idempotency_key_is_stable_across_runs_and_new_when_forced(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.idem.echo"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def echo(input, call):
            CALLS.append("{tool_id}")
            KEYS.append(call.idempotency_key)
            if len(KEYS) == 1:
                raise ProviderTransientError("try again", category="rate_limit")
            return {{"key": call.idempotency_key, "receipt_key": call.receipt_key,
                     "run_id": call.run_id, "attempt": call.attempt}}

        @play("idem")
        async def idem(ctx, input):
            result = await ctx.tools.execute("echo", "{tool_id}", {{"q": 1}}, force=input["force"])
            return {{**result.output, "execution": result.execution, "key_of_result": result.receipt_key}}
        """,
    )
    KEYS.clear()

    first = run_play(play_file, db, {"force": False})  # transient failure: retried next run
    second = run_play(play_file, db, {"force": False})

    assert first.status == "failed"
    assert second.status == "completed", second.error
    assert KEYS[0] == KEYS[1]
    assert KEYS[0].startswith("dl-")
    assert second.output["key"] == KEYS[1]
    assert second.output["run_id"] == second.run_id
    assert second.output["attempt"] == 1
    assert second.output["receipt_key"] == second.output["key_of_result"]

    third = run_play(play_file, db, {"force": True})
    fourth = run_play(play_file, db, {"force": True})

    assert (third.status, fourth.status) == ("completed", "completed")
    assert (third.output["execution"], fourth.output["execution"]) == ("live", "live")
    assert CALLS.count(tool_id) == 4
    assert len(set(KEYS)) == 3  # forced calls each carry a fresh key
    assert third.output["receipt_key"] == second.output["receipt_key"]
    [receipt] = receipts_of(db, tool=tool_id)
    assert receipt.idempotency_key == KEYS[-1]


def test_local_tool_error_fails_for_good_until_refresh_failed(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.value.boom"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def boom(input):
            CALLS.append("{tool_id}")
            if CALLS.count("{tool_id}") == 1:
                raise ValueError("bad shape")
            return {{"ok": True}}

        @play("value")
        async def value_play(ctx, input):
            result = await ctx.tools.execute("boom", "{tool_id}", {{"q": 1}})
            return result.output
        """,
    )

    first = run_play(play_file, db)

    assert first.status == "failed"
    assert first.error is not None
    assert "bad shape" in first.error["message"]
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.retryable) == ("failed", "internal", False)
    assert receipt.error is not None and receipt.error["category"] == "internal"
    assert CALLS.count(tool_id) == 1

    second = run_play(play_file, db)

    assert second.status == "failed"
    assert CALLS.count(tool_id) == 1
    assert second.error is not None and "bad shape" in second.error["message"]
    assert second.stats["tools"][tool_id]["failed"] == 1

    third = run_play(play_file, db, refresh_failed=True)

    assert third.status == "completed", third.error
    assert third.output == {"ok": True}
    assert CALLS.count(tool_id) == 2
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.error) == ("completed", None, None)


def test_provider_transient_error_is_retried_on_the_next_run(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.transient.flaky"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def flaky(input):
            CALLS.append("{tool_id}")
            if CALLS.count("{tool_id}") == 1:
                raise ProviderTransientError("503 from upstream", category="upstream", status_code=503)
            return {{"ok": True}}

        @play("transient")
        async def transient(ctx, input):
            return (await ctx.tools.execute("flaky", "{tool_id}", {{"q": 1}})).output
        """,
    )

    first = run_play(play_file, db)

    assert first.status == "failed"
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.retryable) == ("failed", "upstream", True)

    second = run_play(play_file, db)

    assert second.status == "completed", second.error
    assert second.output == {"ok": True}
    assert CALLS.count(tool_id) == 2


def test_step_runs_once_per_run_and_a_resume_replays_its_value(tmp_path: Path, db: Path) -> None:
    marker = "rb.step.compute"
    play_file = write_play(
        tmp_path,
        f"""
        @play("stepper")
        async def stepper(ctx, input):
            def compute():
                CALLS.append("{marker}")
                return {{"n": CALLS.count("{marker}")}}

            async def compute_async():
                return compute()

            first = await ctx.step("compute", compute)
            again = await ctx.step("compute", compute)
            other = await ctx.step("other", compute_async)
            if ctx.run.attempt == 1 and input["fail"]:
                raise RuntimeError("the play failed after its steps")
            return {{"first": first, "again": again, "other": other, "attempt": ctx.run.attempt}}
        """,
    )

    failed_run = run_play(play_file, db, {"fail": True})

    assert failed_run.status == "failed"
    assert failed_run.error is not None
    assert "the play failed after its steps" in failed_run.error["message"]
    assert CALLS.count(marker) == 2  # "compute" once, "other" once

    resumed = resume_run(failed_run.run_id, db)

    assert resumed.status == "completed", resumed.error
    assert resumed.run_id == failed_run.run_id
    assert resumed.output == {"first": {"n": 1}, "again": {"n": 1}, "other": {"n": 2}, "attempt": 2}
    assert CALLS.count(marker) == 2

    fresh = run_play(play_file, db, {"fail": False})

    assert fresh.status == "completed", fresh.error
    assert fresh.output == {"first": {"n": 3}, "again": {"n": 3}, "other": {"n": 4}, "attempt": 1}
    assert CALLS.count(marker) == 4


def test_a_local_tool_error_reaches_the_play_as_the_same_tool_error_live_and_replayed(tmp_path: Path, db: Path) -> None:
    """The play sees one error type for a failed call, whether it just ran or was replayed."""
    tool_id = "rb.value.typed"
    play_file = write_play(
        tmp_path,
        f"""
        from deepline_cli import ToolExecutionError

        @tool("{tool_id}")
        async def boom(input):
            CALLS.append("{tool_id}")
            raise ValueError("bad shape")

        @play("typed")
        async def typed(ctx, input):
            try:
                await ctx.tools.execute("boom", "{tool_id}", {{"q": 1}})
            except ToolExecutionError as exc:
                return {{"type": type(exc).__name__, "category": exc.category,
                         "retryable": exc.retryable, "message": str(exc)}}
            return "no error"
        """,
    )

    first = run_play(play_file, db)
    second = run_play(play_file, db)

    assert CALLS.count(tool_id) == 1
    assert second.status == "completed", second.error
    assert second.output["category"] == "internal"
    assert second.output["retryable"] is False
    assert first.status == "completed", f"the live failure escaped as {first.error}"
    assert first.output == second.output


def test_a_receipt_key_is_the_same_in_every_version_and_process() -> None:
    """Receipts written by an earlier deepline must be found again: the key of a call is a
    fixed function of its parts (length-prefixed, SHA-256, 128 bits), pinned here to the
    value this version's predecessors computed."""
    from deepline_cli.runtime.calls.receipts import receipt_key

    key = receipt_key("tool", "default", "leads", "hunter.email_finder", b'{"domain":"acme.com"}', "", "1")
    assert key == "422eab98cb4b006c8b2b55f902159b56"
    assert receipt_key("ab", "c") != receipt_key("a", "bc")  # the parts' lengths are in the key


@given(
    st.lists(st.text(), max_size=4),
    st.binary(max_size=64),
    st.lists(st.text(), max_size=3),
)
def test_a_digest_with_its_head_hashed_once_is_the_digest_of_all_its_parts(
    head: list[str], middle: bytes, tail: list[str]
) -> None:
    from deepline_cli import _json

    assert _json.Digest(tuple(head), tuple(tail)).of(middle) == _json.digest(*head, middle, *tail)


def test_a_tool_calls_receipt_key_in_a_run_is_the_key_of_its_parts(tmp_path: Path, db: Path) -> None:
    """The key a run claims (its tool's fixed parts hashed once per tool) is the pinned
    function of every part: the same receipts are found by any version and process."""
    from deepline_cli import _json
    from deepline_cli.runtime.calls.receipts import receipt_key

    play = tmp_path / "keyed.py"
    play.write_text(
        textwrap.dedent(
            """
            from deepline_cli import play, tool

            @tool("k.echo", version="3")
            def echo(input):
                return input

            @play("keyed")
            async def keyed(ctx, input):
                for n in range(3):
                    await ctx.tools.execute(f"e{n}", "k.echo", {"n": n, "name": "é"})
                return {}
            """
        )
    )
    assert run_play(play, db).status == "completed"
    stored = {r.key for r in SQLiteStore(db).receipts.query_receipts(ReceiptQuery())}
    expected = {
        receipt_key("tool", "default", "keyed", "k.echo", _json.canonical({"n": n, "name": "é"}), "", "3")
        for n in range(3)
    }
    assert stored == expected


def test_a_receipt_keeps_the_answer_as_it_came_whatever_the_play_does_with_it_after(tmp_path: Path, db: Path) -> None:
    """A paid answer is recorded as the provider gave it: a resolver that adds to the answer
    it got (`r.output["seen"] = …`) and a later column that changes the row's value change the
    row, never the receipt (it was written after them and kept their changes, so a re-run
    replayed an answer no provider gave)."""
    play_file = write_play(
        tmp_path,
        """
        @tool("rb.frozen.lookup")
        def lookup(input):
            return {"domain": input["domain"], "people": [{"name": "Ada"}]}

        async def company(row, rc):
            answer = await rc.tools.execute("lookup", "rb.frozen.lookup", {"domain": row["domain"]})
            answer.output["seen"] = True  # the play's own note on the answer it got
            return answer

        def later(row):
            row["company"]["people"].append({"name": "added by a later column"})
            return len(row["company"]["people"])

        @play("frozen")
        async def frozen(ctx, input):
            rows = await ctx.map("m", [{"domain": f"d{i}.com"} for i in range(30)], key="domain",
                                 columns={"company": company, "count": later})
            return [row["count"] for row in rows]
        """,
    )
    first = run_play(play_file, db)
    assert first.status == "completed", first.error
    assert first.output == [2] * 30
    stored = receipts_of(db, tool="rb.frozen.lookup")
    assert len(stored) == 30
    assert all(r.output == {"domain": r.output["domain"], "people": [{"name": "Ada"}]} for r in stored), [
        r.output for r in stored if "seen" in r.output or len(r.output["people"]) != 1
    ][:2]


def test_rows_sharing_one_call_in_flight_each_get_the_answer_as_it_came(tmp_path: Path, db: Path) -> None:
    """Rows asking the same call at once share one call: each row's value is its own copy of
    the answer, so what one row's later column does to it is not in another row's."""
    play_file = write_play(
        tmp_path,
        """
        @tool("rb.shared.lookup")
        async def lookup(input):  # in flight from its claim (a commit away) while the other rows ask too
            CALLS.append("rb.shared.lookup")
            return {"domain": input["domain"], "people": [{"name": "Ada"}]}

        def company(row, rc):
            return rc.tools.execute("lookup", "rb.shared.lookup", {"domain": row["domain"]})

        def later(row):
            row["company"]["people"].append({"name": "added by row " + row["id"]})
            return [p["name"] for p in row["company"]["people"]]

        @play("shared")
        async def shared(ctx, input):
            rows = await ctx.map("m", [{"id": str(i), "domain": "same.com"} for i in range(6)], key="id",
                                 columns={"company": company, "names": later})
            return {row["id"]: row["names"] for row in rows}
        """,
    )
    CALLS.clear()
    first = run_play(play_file, db)
    assert first.status == "completed", first.error
    assert CALLS == ["rb.shared.lookup"]  # one call, shared by the six rows
    assert first.output == {str(i): ["Ada", f"added by row {i}"] for i in range(6)}
    (stored,) = receipts_of(db, tool="rb.shared.lookup")
    assert stored.output == {"domain": "same.com", "people": [{"name": "Ada"}]}
