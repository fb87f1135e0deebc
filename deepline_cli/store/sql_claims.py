"""Claims and settlements in SQL: the receipt state machine (store/base.py) applied under row locks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deepline_cli.store.claims import Had, decide_claim
from deepline_cli.store.records import Claim, ClaimOutcome, Receipt, Settlement
from deepline_cli.store.sql_base import SqlBase
from deepline_cli.store.sql_rows import (
    CLAIM_UPDATE,
    KEEP_HISTORY,
    RECEIPT_COLUMNS,
    chunks,
    claim_row,
    claimed_receipt,
    json_or_none,
    receipt_from_row,
    replaced_answer,
    settle_statement,
)


class ClaimsSql(SqlBase):
    """Claims and settlements in SQL: the receipt state machine (store/base.py) applied under row locks."""

    def _claim(
        self,
        c: Any,
        claims: Sequence[Claim],
        now: float,
        superseded: set[tuple[str, int]],
        known: Mapping[str, Receipt | None] | None = None,
    ) -> list[ClaimOutcome]:
        """Decide every claim against the stored receipt, under a row lock where the
        database has them; a key another process inserted meanwhile is decided again.
        A claim of a `superseded` attempt is refused (fencing). `known`: receipts this
        transaction has read (and locked) already, None where there is none."""
        known = known or {}
        existing = {key: receipt for key, receipt in known.items() if receipt is not None}
        existing.update(self._load_for_update(c, [cl.key for cl in claims if cl.key not in known]))
        outcomes: dict[int, ClaimOutcome] = {}
        replaced: list[Receipt] = []
        pending = []
        for position, cl in enumerate(claims):
            if (cl.run_id, cl.attempt) in superseded:
                outcomes[position] = ClaimOutcome("superseded", claimed_receipt(None, cl, now))
            else:
                pending.append((position, cl))
        had = self._had(c, [cl for _, cl in pending], existing)
        while pending:
            inserts: list[tuple[int, Claim, Receipt]] = []
            for position, cl in pending:
                current = existing.get(cl.key)
                verdict = decide_claim(current, cl, now, had=had.get((cl.run_id, cl.key)))
                prior = current
                replacing = replaced_answer(current, cl) if verdict == "claimed" else None
                if verdict == "claimed":
                    if current is not None and current.run_id != cl.run_id:
                        replaced.append(current)
                    claimed = claimed_receipt(current, cl, now)
                    if current is None:
                        inserts.append((position, cl, claimed))
                    else:
                        c.execute(CLAIM_UPDATE, claim_row(claimed))
                    existing[cl.key] = current = claimed
                assert current is not None
                outcomes[position] = ClaimOutcome(verdict, current, prior=prior, replaces=replacing)
            lost = self._insert_claims(c, inserts, now)
            for _, cl, _ in lost:  # another process inserted it since we looked: decide again
                existing.pop(cl.key, None)
            existing.update(self._load_for_update(c, [cl.key for _, cl, _ in lost]))
            pending = [(position, cl) for position, cl, _ in lost]
        ordered = [outcomes[i] for i in range(len(claims))]
        self._point_members(c, claims, ordered)
        # Receipts a run owns are found by their owner column; only receipts it used but
        # another run owns (reuse, or one taken over from it) need a usage row.
        using = [
            (cl, o)
            for cl, o in zip(claims, ordered, strict=True)
            if o.verdict in ("reused", "failed") and o.receipt.run_id != cl.run_id
        ]
        used = self._used_before(c, [(cl.run_id, o.receipt.key) for cl, o in using])
        for cl, o in using:
            o.first_use = (cl.run_id, o.receipt.key) not in used
            used.add((cl.run_id, o.receipt.key))
        usage: list[tuple[str, str, float | None, str | None, str | None, str | None]] = [
            (cl.run_id, o.receipt.key, now, cl.map, cl.row_key, o.receipt.status) for cl, o in using
        ]
        # A run whose receipt another run took over keeps it among its own (no use yet: its
        # `used_at` is NULL); when that run is answered from it later, that is its first use.
        # (Not one it gave back unsent: it never had it.)
        usage += [
            (before.run_id, before.key, None, None, None, None)
            for before in replaced
            if before.run_id and before.status != "skipped"
        ]
        self._many(
            c,
            "INSERT INTO run_receipts (run_id, key, used_at, map, row_key, status) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id, key) DO UPDATE SET used_at = coalesce(run_receipts.used_at, excluded.used_at),"
            " map = coalesce(run_receipts.map, excluded.map),"
            " row_key = coalesce(run_receipts.row_key, excluded.row_key),"
            " status = excluded.status WHERE excluded.used_at IS NOT NULL AND (run_receipts.used_at IS NULL"
            # A failure given back, then (a resume, after another run refreshed it) an answer: answered.
            " OR (excluded.status = 'completed' AND coalesce(run_receipts.status, '') <> 'completed'))",
            usage,
        )
        return ordered

    def _had(self, c: Any, claims: Sequence[Claim], existing: Mapping[str, Receipt]) -> dict[tuple[str, str], Had]:
        """How these claims' runs had the receipts other runs hold now, where that decides the
        claim (one it may find stale, or force): "used" (answered from it) or "owned" (it paid
        for it, and another run refreshed it since). Their staleness is judged once per run."""
        asking = []
        for cl in claims:
            found = existing.get(cl.key)
            decides = cl.force or cl.stale_after_s is not None or cl.refresh_after_s is not None
            if decides and found is not None and found.run_id != cl.run_id and found.status in ("completed", "failed"):
                asking.append((cl.run_id, cl.key))
        return {pair: "owned" if used_at is None else "used" for pair, used_at in self._usage(c, asking).items()}

    def _used_before(self, c: Any, uses: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (run, receipt key) pairs were used already (not only owned before)."""
        return {pair for pair, used_at in self._usage(c, uses).items() if used_at is not None}

    def _usage(self, c: Any, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float | None]:
        """The usage rows of these (run, receipt key) pairs that exist: when each was first used
        (None: owned before another run took the receipt over, not used since)."""
        found: dict[tuple[str, str], float | None] = {}
        for run_id in dict.fromkeys(run_id for run_id, _ in pairs):
            keys = list(dict.fromkeys(key for other, key in pairs if other == run_id))
            for chunk in chunks(keys):
                among, params = self._in_texts("key", chunk)
                sql = f"SELECT key, used_at FROM run_receipts WHERE run_id = ? AND {among}"
                found.update(((run_id, key), used_at) for key, used_at in c.execute(sql, [run_id, *params]).fetchall())
        return found

    def _point_members(self, c: Any, claims: Sequence[Claim], outcomes: Sequence[ClaimOutcome]) -> None:
        """A batch about to be sent: each member receipt records the aggregate it goes in."""
        pointers = [
            (cl.key, member, lease_id)
            for cl, o in zip(claims, outcomes, strict=True)
            if cl.members and o.verdict == "claimed"
            for member, lease_id in cl.members
        ]
        self._many(
            c,
            "UPDATE receipts SET batch_key = ? WHERE key = ? AND lease_id = ? AND status = 'running'",
            pointers,
        )

    def _insert_claims(
        self, c: Any, inserts: list[tuple[int, Claim, Receipt]], now: float
    ) -> list[tuple[int, Claim, Receipt]]:
        """Insert new receipts, in key order; return the ones that lost a race to another
        process (each backend's own statement: SQLite's batch INSERT, PostgreSQL's arrays)."""
        raise NotImplementedError

    def _load_for_update(self, c: Any, keys: Sequence[str]) -> dict[str, Receipt]:
        found: dict[str, Receipt] = {}
        for chunk in chunks(list(dict.fromkeys(keys))):
            among, params = self._in_texts("key", chunk)
            sql = f"SELECT {RECEIPT_COLUMNS} FROM receipts WHERE {among} ORDER BY key{self.row_lock}"
            for row in c.execute(sql, params).fetchall():
                found[row[0]] = receipt_from_row(row)
        return found

    def _settle_all(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Apply each settlement if its lease is still current (one statement each)."""
        return [bool(c.execute(*settle_statement(s, now)).rowcount == 1) for s in settlements]

    def _settle(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Settle in key order (rows lock in one order, so two processes rarely deadlock),
        and add the executions that ended to the calls ledger."""
        order = sorted(range(len(settlements)), key=lambda i: settlements[i].key)
        results = self._settle_all(c, [settlements[i] for i in order], now)
        done = dict(zip(order, results, strict=True))
        fresh = [done[i] for i in range(len(settlements))]
        settled = fresh
        if not all(fresh):
            before = self._settled_before(c, [s for s, ok in zip(settlements, fresh, strict=True) if not ok])
            settled = [ok or (s.key, s.lease_id) in before for s, ok in zip(settlements, fresh, strict=True)]
        ledger = [
            (
                st.call.run_id,
                st.call.attempt,
                st.key,
                st.call.kind,
                st.call.tool,
                st.ended or st.status,
                st.credits,
                st.call.started_at,
                now,
                st.call.retries,
                st.failure_kind,
                st.call.map,
                st.call.row_key,
                round(st.call.waited_s, 6),
            )
            for st, applied in zip(settlements, fresh, strict=True)  # applied now, not by an earlier try
            if applied and st.call is not None and (st.ended or st.status) in ("completed", "failed")
        ]
        self._insert(
            c,
            "INSERT INTO calls (run_id, attempt, key, kind, tool, status, credits, started_at, ended_at, retries,"
            " category, map, row_key, waited_s)",
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            "",
            ledger,
        )
        replaced = [
            (r.key, r.generation, r.run_id, r.attempt, r.idempotency_key, json_or_none(r.output), r.credits,
             r.completed_at, now)
            for st, applied in zip(settlements, fresh, strict=True)
            if applied and (r := st.replaces) is not None and st.status in ("completed", "failed")
        ]  # fmt: skip
        self._many(c, KEEP_HISTORY, replaced)
        costs: dict[str, list[float]] = {}
        for st, applied in zip(settlements, fresh, strict=True):
            if applied and st.reported and st.status == "completed" and st.call is not None and st.call.tool:
                costs.setdefault(st.call.tool, []).append(st.credits)
        self._many(
            c,
            "INSERT INTO tool_costs (tool, answers, credits, max_credits) VALUES (?, ?, ?, ?) ON CONFLICT (tool)"
            " DO UPDATE SET answers = tool_costs.answers + excluded.answers, credits = tool_costs.credits"
            " + excluded.credits, max_credits = CASE WHEN excluded.max_credits > tool_costs.max_credits"
            " THEN excluded.max_credits ELSE tool_costs.max_credits END",
            [(tool, len(paid), sum(paid), max(paid)) for tool, paid in sorted(costs.items())],
        )
        return settled

    def _settled_before(self, c: Any, settlements: Sequence[Settlement]) -> set[tuple[str, str]]:
        """The (key, lease) of those of these very settlements that ended already (a
        transaction run again after its connection dropped, though it had committed):
        applied, not taken over. Another lease's settlement of the same key is not."""
        among, params = self._in_texts("key", [s.key for s in settlements])
        rows = c.execute(f"SELECT key, lease_id, status FROM receipts WHERE {among}", params).fetchall()
        found = {key: (lease, status) for key, lease, status in rows}

        def ended(s: Settlement) -> bool:  # a skip restores an earlier answer or failure
            return found.get(s.key) in ((s.lease_id, s.status), (s.lease_id, "completed"), (s.lease_id, "failed"))

        return {(s.key, s.lease_id) for s in settlements if ended(s)}
