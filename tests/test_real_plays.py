"""Plays written the way go-to-market engineers write them, run through the real command
in a new process each time, against a real loopback provider (tests/provider.py).

Each test here stood for a bug that plays ported from real Deepline plays hit: a column
fingerprint that changed with Python's hash seed, cells reused across different play
inputs, a map without columns refused, an async `run_if` never awaited, and stale cells
answered from old receipts.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Result
from tests.helpers import resume_run, run_play
from tests.provider import Provider, ProviderServer, Seen

Run = Callable[..., Result]


@dataclass
class DirectoryProvider(Provider):
    """A people-data provider: `/find` answers an email for the people it knows (a
    different address per path, so two providers' answers are told apart), and an empty
    answer for the others. Each answer carries a serial number,
    so a refreshed call is told from a replayed one."""

    known: frozenset[str] = frozenset()
    serial: int = 0

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        body = seen.body if isinstance(seen.body, dict) else {}
        key = seen.headers.get("idempotency-key", "")
        if key in self.answers:
            return 200, {"content-type": "application/json"}, json.dumps(self.answers[key]).encode()
        self.serial += 1
        first, domain = str(body.get("first", "")).lower(), str(body.get("domain", ""))
        provider = seen.path.strip("/").split("/")[0]
        found = domain in self.known
        payload: dict[str, Any] = {
            "email": f"{first}@{domain}" if found else None,
            "provider": provider,
            "serial": self.serial,
        }
        self.answers[key] = payload
        self.billed[key] += 1
        return 200, {"content-type": "application/json"}, json.dumps(payload).encode()


LEADS = """\
first,domain
Ada,analytical.engine
Grace,cobol.dev
Alan,bletchley.park
info,generic.example
Linus,kernel.org
"""
KNOWN = frozenset({"analytical.engine", "cobol.dev", "bletchley.park", "kernel.org"})


@pytest.fixture
def provider() -> Iterator[DirectoryProvider]:
    with ProviderServer(DirectoryProvider(known=KNOWN)) as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def project(tmp_path: Path, provider: DirectoryProvider) -> Callable[[str], Path]:
    """A play folder: play.py, deepline.toml (two HTTP tools on the provider), leads.csv."""

    def write(source: str) -> Path:
        (tmp_path / "leads.csv").write_text(LEADS)
        (tmp_path / "deepline.toml").write_text(
            textwrap.dedent(
                f"""\
                [tools."people.alpha"]
                url = "{provider.url}/alpha/find"
                json = {{ first = "{{first}}", domain = "{{domain}}" }}
                credits = 1

                [tools."people.beta"]
                url = "{provider.url}/beta/find"
                json = {{ first = "{{first}}", domain = "{{domain}}" }}
                credits = 2
                """
            )
        )
        play = tmp_path / "play.py"
        play.write_text(textwrap.dedent(source))
        return play

    return write


def finished(result: Result) -> dict[str, Any]:
    """The `run.finished` event of a `--json` run."""
    assert result.code == 0, result.stderr
    events = result.json_lines()
    assert events and events[-1]["event"] == "run.finished", result.stdout[-2000:]
    return events[-1]


def exported(deepline: Run, run_id: str) -> list[dict[str, Any]]:
    result = deepline("export", run_id, "--format", "jsonl")
    assert result.code == 0, result.stderr
    return result.json_lines()


# --- a column's fingerprint is the same in every process -----------------------------------

HELPERS_PLAY = """\
from deepline_cli import play

GENERIC = {"info", "sales", "hello", "contact", "team", "admin"}


def normalise(domain):
    return domain.strip().lower()


def person(row):
    return {"first": row["first"].strip().title(), "domain": normalise(row["domain"])}


def email_of(answer):
    return (answer or {}).get("email")


def is_generic(row):
    return row["first"].strip().lower() in GENERIC


async def find_email(row, rc):
    if is_generic(row):
        return None
    result = await rc.tools.execute("find", "people.alpha", person(row))
    return email_of(result.output)


@play("helpers")
async def helpers(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", columns={"email": find_email})
    return {"rows": len(rows)}
"""


def test_fingerprint_does_not_depend_on_the_hash_seed(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    """A resolver that calls several of the play's own helpers: every later run, each in a
    process with another hash seed, reuses every cell and sends nothing."""
    play = project(HELPERS_PLAY)
    first = finished(deepline("run", str(play), "--csv", "leads.csv", "--json", PYTHONHASHSEED="1"))
    assert first["stats"]["rows"]["succeeded"] == 5
    sent = provider.count()
    assert sent == 4  # the generic address is not looked up
    for seed in ("2", "3", "4", "5"):
        again = finished(deepline("run", str(play), "--csv", "leads.csv", "--json", PYTHONHASHSEED=seed))
        assert again["stats"]["rows"]["reused"] == 5, (seed, again["stats"])
        assert provider.count() == sent, f"seed {seed} sent requests again"


# --- a cell is keyed on the play input it can see --------------------------------------------

PROVIDER_PLAY = """\
from deepline_cli import Column, play


def domain_size(row):
    return len(row["domain"])


@play("by-provider")
async def by_provider(ctx, input):
    tool = "people." + input["provider"]

    async def find_email(row, rc):
        result = await rc.tools.execute("find", tool, {"first": row["first"], "domain": row["domain"]})
        return result.output["provider"] if result.output["email"] else None

    rows = await ctx.map(
        "leads",
        ctx.csv(input["csv"]),
        key="domain",
        columns={
            "found_by": find_email,
            # reads no play input: reused whatever the provider
            "size": Column(domain_size, depends_on=[]),
        },
    )
    return {"rows": len(rows)}
"""


def test_a_cell_computed_under_another_play_input_is_not_reused(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    play = project(PROVIDER_PLAY)
    alpha = finished(deepline("run", str(play), "--csv", "leads.csv", "--set", "provider=alpha", "--json"))
    beta = finished(deepline("run", str(play), "--csv", "leads.csv", "--set", "provider=beta", "--json"))
    assert provider.count("/alpha/find") == 5 and provider.count("/beta/find") == 5
    for event, name in ((alpha, "alpha"), (beta, "beta")):
        rows = exported(deepline, event["run_id"])
        assert {row["found_by"] for row in rows} == {name, None}, rows
        assert [row["size"] for row in rows] == [len(row["domain"]) for row in rows]
    # The column that declares it reads no input kept its cells: 5 cells reused, none computed.
    assert beta["stats"]["rows"]["reused"] == 0
    again = finished(deepline("run", str(play), "--csv", "leads.csv", "--set", "provider=alpha", "--json"))
    assert again["stats"]["rows"]["reused"] == 0  # the sheet holds beta's rows now: recomputed…
    assert provider.count("/alpha/find") == 5  # …from alpha's receipts, unpaid
    assert {row["found_by"] for row in exported(deepline, again["run_id"])} == {"alpha", None}


# --- a map without columns ----------------------------------------------------------------------

COUNT_PLAY = """\
from deepline_cli import play


@play("count")
async def count(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", columns={})
    return {"rows": len(rows), "domains": sorted(row["domain"] for row in rows)}
"""


def test_a_map_without_columns_passes_rows_through(deepline: Run, project: Callable[[str], Path]) -> None:
    play = project(COUNT_PLAY)
    event = finished(deepline("run", str(play), "--csv", "leads.csv", "--json"))
    assert event["output"]["rows"] == 5
    assert len(event["output"]["domains"]) == 5
    again = finished(deepline("run", str(play), "--csv", "leads.csv", "--json"))
    assert again["stats"]["rows"]["reused"] == 5


# --- run_if: sync or async, (row) or (row, index) ---------------------------------------------

RUN_IF_PLAY = """\
import asyncio

from deepline_cli import Column, play


async def worth_a_lookup(row):
    await asyncio.sleep(0)  # a predicate that asks something first
    return row["domain"] != "generic.example"


def first_three(row, index):
    return index < 3


def lookup(row, rc):
    return rc.tools.execute("find", "people.alpha", {"first": row["first"], "domain": row["domain"]})


@play("run-if")
async def run_if(ctx, input):
    rows = await ctx.map(
        "leads",
        ctx.csv(input["csv"]),
        key="domain",
        columns={
            "email": Column(lookup, run_if=worth_a_lookup),
            "early": Column(lambda row: row["domain"], run_if=first_three),
        },
    )
    return {"rows": len(rows)}
"""


def test_run_if_may_be_async_and_take_the_row_index(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    play = project(RUN_IF_PLAY)
    event = finished(deepline("run", str(play), "--csv", "leads.csv", "--json"))
    rows = exported(deepline, event["run_id"])
    assert provider.count("/alpha/find") == 4
    assert [row["email"] is None for row in rows] == [False, False, False, True, False]
    assert [row["early"] for row in rows] == ["analytical.engine", "cobol.dev", "bletchley.park", None, None]


# --- staleness refreshes the provider ----------------------------------------------------------

REFRESH_PLAY = """\
import os

from deepline_cli import Column, play


def recheck(previous):
    # a found email is good for long; a not-found is asked again soon
    found = previous is not None and previous["email"] is not None
    return float(os.environ["FOUND_TTL" if found else "NOT_FOUND_TTL"])


async def find_email(row, rc):
    result = await rc.tools.execute("find", "people.alpha", {"first": row["first"], "domain": row["domain"]})
    return result.output


@play("refresh")
async def refresh(ctx, input):
    rows = await ctx.map(
        "leads", ctx.csv(input["csv"]), key="domain",
        columns={"answer": Column(find_email, stale_after_seconds=recheck)},
    )
    return {"rows": len(rows)}
"""


def test_a_stale_cell_calls_its_provider_again(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    """`stale_after_seconds` as a function of the previous value: only the not-found row is
    stale on the next run, and it is asked again (a new idempotency key), while the found
    rows are reused whole."""
    play = project(REFRESH_PLAY)
    ttl = {"FOUND_TTL": "2592000", "NOT_FOUND_TTL": "0.3"}
    first = finished(deepline("run", str(play), "--csv", "leads.csv", "--json", **ttl))
    assert provider.count() == 5
    keys_before = [r.headers["idempotency-key"] for r in provider.requests]
    time.sleep(0.4)  # past the not-found row's TTL (measured by the store's clock)
    second = finished(deepline("run", str(play), "--csv", "leads.csv", "--json", **ttl))
    assert provider.count() == 6, [r.body for r in provider.requests]
    again = provider.requests[-1]
    assert again.body["domain"] == "generic.example"
    assert again.headers["idempotency-key"] not in keys_before
    assert second["stats"]["rows"]["reused"] == 4
    before = {row["domain"]: row["answer"]["serial"] for row in exported(deepline, first["run_id"])}
    after = {row["domain"]: row["answer"]["serial"] for row in exported(deepline, second["run_id"])}
    assert after["generic.example"] > max(before.values())  # the new answer, not the old receipt
    assert {d: s for d, s in after.items() if d != "generic.example"} == {
        d: s for d, s in before.items() if d != "generic.example"
    }


def test_a_nightly_refresh_pays_for_every_stale_row_once(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    """A column with a short TTL: the next run re-calls every row (a new receipt
    generation, a new key), and a resume of that run pays for nothing more."""
    play = project(REFRESH_PLAY)
    ttl = {"FOUND_TTL": "0.3", "NOT_FOUND_TTL": "0.3"}
    finished(deepline("run", str(play), "--csv", "leads.csv", "--json", **ttl))
    assert provider.count() == 5
    time.sleep(0.4)
    second = finished(deepline("run", str(play), "--csv", "leads.csv", "--json", **ttl))
    assert provider.count() == 10
    assert second["stats"]["tools"]["people.alpha"]["live"] == 5
    assert len({r.headers["idempotency-key"] for r in provider.requests}) == 10
    history = deepline("receipts", "inspect", "--run", second["run_id"], "--json", "--history")
    assert history.code == 0, history.stderr
    receipts = history.json_lines()
    assert [r["generation"] for r in receipts] == [2] * 5
    # the answers of the first night stay, as generation 1, each with the key it was sent with
    for receipt in receipts:
        (old,) = receipt["history"]
        assert old["generation"] == 1 and old["idempotency_key"] != receipt["idempotency_key"]
        assert old["output"]["serial"] <= 5  # the provider's first five answers


# --- nothing that leaves a process depends on the process -----------------------------------

FINGERPRINTS = """\
import json
import sys

from deepline_cli.runtime.map.columns import Column, resolve_columns
from deepline_cli.runtime.run.play import load_module
from deepline_cli.runtime.map.rows import key_function, row_digest

module = load_module(__import__("pathlib").Path(sys.argv[1]))
columns = resolve_columns(module.COLUMNS, {"provider": "alpha", "tiers": ["a", "b"]})
row = {"domain": "acme.com", "first": "Ada", "tags": {"b": 1, "a": 2}}
print(json.dumps({
    "columns": [c.fingerprint for c in columns],
    "row": row_digest(row),
    "key": key_function(module.key)(row),
}))
"""

TRICKY_PLAY = """\
import functools

from deepline_cli import Column

GENERIC = {"info", "sales", "hello", "contact", "team", "admin", "support"}
TIERS = frozenset({"gold", "silver", "bronze", "lead"})
SCORES = {"vp": 3, "director": 2, "manager": 1}


class Scorer:
    weights = {"b": 1, "a": 2}

    def score(self, title):
        return SCORES.get(title, 0) + len(TIERS)

    @staticmethod
    def normalise(text):
        return text.strip().lower()


def generic(row):
    return row["first"].lower() in {"info", "sales", "hello", "contact", "team"}


def make(prefix):
    allowed = frozenset({"a", "b", "c", "d"})

    def resolver(row, rc):
        return prefix + str(row["first"] in allowed) + Scorer.normalise(row["domain"])

    return resolver


def key(row):
    return {"first": row["first"], "domain": row["domain"], "tags": row["tags"]}


COLUMNS = {
    "generic": lambda row: generic(row) or row["first"] in GENERIC,
    "made": make("x"),
    "scored": Column(lambda row: Scorer().score(row["first"]), run_if=generic, depends_on=["provider"]),
    "partial": functools.partial(lambda tier, row: tier in TIERS, "gold"),
}
"""


def test_fingerprints_keys_and_digests_are_the_same_under_every_hash_seed(tmp_path: Path) -> None:
    """Set constants, sets and dicts of the play's module, closures, classes, partials and
    dict-valued row keys: computed in six processes with six hash seeds, all equal."""
    import os
    import subprocess
    import sys

    (tmp_path / "tricky.py").write_text(TRICKY_PLAY)
    (tmp_path / "fingerprints.py").write_text(FINGERPRINTS)
    seen = set()
    for seed in range(6):
        out = subprocess.run(
            [sys.executable, str(tmp_path / "fingerprints.py"), str(tmp_path / "tricky.py")],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            check=True,
        )
        seen.add(out.stdout)
    assert len(seen) == 1, seen


# --- a resume replays what the run paid for, however short its staleness --------------------

SNAPSHOT_PLAY = """\
from deepline_cli import play


@play("approval")
async def approval(ctx, input):
    # A fresh answer every run (stale at once), then a person approves before the export.
    snapshot = await ctx.tools.execute("snapshot", "people.alpha", {"first": "Ada", "domain": "analytical.engine"},
                                       stale_after_seconds=0)
    forced = await ctx.tools.execute("forced", "people.beta", {"first": "Ada", "domain": "analytical.engine"},
                                     force=True)
    approved = await ctx.wait_for_event("approved")
    return {"serial": snapshot.output["serial"], "forced": forced.output["serial"], "approved": approved}
"""


def test_a_resume_does_not_pay_again_for_a_call_stale_at_once(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    """`stale_after_seconds=0` asks again on every run, but a resume of the same run replays
    what that run was answered (as `force=True` does), it does not pay for it again."""
    play = project(SNAPSHOT_PLAY)
    waiting = deepline("run", str(play), "--run-id", "snap-1", "--json")
    assert waiting.code == 3, waiting.stderr
    assert provider.count() == 2
    assert deepline("events", "send", "snap-1", "approved", "--payload", "true").code == 0
    resumed = finished(deepline("resume", "snap-1", "--json"))
    assert provider.count() == 2, [r.path for r in provider.requests]  # nothing paid twice
    assert resumed["output"] == {"serial": 1, "forced": 2, "approved": True}
    assert resumed["stats"]["credits"] == 3
    # A new run asks again: stale at once, and forced.
    assert deepline("run", str(play), "--run-id", "snap-2", "--json").code == 3
    assert provider.count() == 4


DECIMAL_PLAY = """\
from decimal import Decimal

from deepline_cli import Column, play, tool


@tool("fx.convert")
def convert(input):
    return {"eur": Decimal(str(input["usd"])) * Decimal("0.5")}


@play("deals")
async def deals(ctx, input):
    rows = [{"id": "a", "amount": "1.50"}, {"id": "b", "amount": "20"}]
    done = await ctx.map("deals", rows, key="id", columns={
        "usd": lambda row: Decimal(row["amount"]),
        "eur": Column(lambda row, rc: rc.tools.execute("fx", "fx.convert", {"usd": Decimal(row["amount"])}),
                      recompute=True),
    })
    return {"rows": len(done)}
"""


def test_decimal_money_is_kept_and_keyed_as_the_number_it_is(deepline: Run, project: Callable[[str], Path]) -> None:
    """Money parsed with Decimal: a cell holds the number (not the text "Decimal('1.50')"),
    and a tool input holding one is keyed like any number."""
    play = project(DECIMAL_PLAY)
    first = finished(deepline("run", str(play), "--json"))
    rows = exported(deepline, first["run_id"])
    assert [(r["usd"], r["eur"]) for r in rows] == [(1.5, {"eur": 0.75}), (20, {"eur": 10})]
    again = finished(deepline("run", str(play), "--json"))
    convert = again["stats"]["tools"]["fx.convert"]
    assert (convert["live"], convert["reused"]) == (0, 2)  # the same keys: the receipts answer


# --- a resume matches the rows it finished by their keys, not their places -----------------

EVERY_ROW_PLAY = """\
from deepline_cli import play


async def find_email(row, rc):
    result = await rc.tools.execute("find", "people.alpha", {"first": row["first"], "domain": row["domain"]})
    return result.output["email"]


@play("every-row")
async def every_row(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", concurrency=1, columns={"email": find_email})
    return {"rows": len(rows), "domains": [row["domain"] for row in rows]}
"""


def test_a_resume_over_rows_in_another_order_finishes_each_row_once(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """Rows come back in another order on resume (a list built from a set, whose order
    changes with the hash seed; a CSV sorted again, or edited): the rows the first attempt
    finished are matched by key, not by place. Each distinct row is in the result once,
    none is left out, a row no longer in the input is not in it, and nothing is paid twice."""
    play = project(EVERY_ROW_PLAY)
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "order", "--max-credits", "2", "--json")
    assert stopped.code == 1 and provider.count() == 2, stopped.stderr
    header, *lines = LEADS.splitlines()
    kept = [line for line in reversed(lines) if not line.startswith("Alan,")]  # reordered, one row dropped
    (tmp_path / "leads.csv").write_text("\n".join([header, *kept]) + "\n")
    done = finished(deepline("resume", "order", "--max-credits", "100", "--json"))
    domains = [line.split(",")[1] for line in kept]
    assert done["output"] == {"rows": 4, "domains": domains}
    rows = exported(deepline, "order")
    firsts = [line.split(",")[0].lower() for line in kept]
    assert [(r["domain"], r["email"]) for r in rows] == [
        (d, None if d == "generic.example" else f"{first}@{d}") for first, d in zip(firsts, domains, strict=True)
    ]
    assert set(provider.billed.values()) == {1}  # no call paid twice
    shown = json.loads(deepline("runs", "show", "order", "--json").stdout)
    assert shown["maps"][0]["rows"] == shown["maps"][0]["succeeded"] == 4, shown["maps"]
    rows_stats = done["stats"]["rows"]
    assert (rows_stats["succeeded"], rows_stats["from_earlier_attempts"]) == (4, 2), rows_stats


def test_a_resume_stopped_over_rows_in_another_order_holds_each_row_once(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """A resume over rows in another order that stops before it has passed every place the
    first attempt wrote: a row it did again at its new place is not also left at its old one.
    The partial export holds each row once, and `runs show` counts what the export holds."""
    play = project(EVERY_ROW_PLAY)
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "moved", "--max-credits", "2", "--json")
    assert stopped.code == 1 and provider.count() == 2, stopped.stderr  # Ada at place 0, Grace at 1
    header, ada, grace, *rest = LEADS.splitlines()
    (tmp_path / "leads.csv").write_text("\n".join([header, grace, *rest, ada]) + "\n")  # Grace first now
    again = deepline("resume", "moved", "--max-credits", "2", "--json")  # Grace from the sheet, then no credit left
    assert again.code == 1 and provider.count() == 2, again.stderr
    domains = [row["domain"] for row in exported(deepline, "moved")]
    assert "cobol.dev" in domains and len(set(domains)) == len(domains), domains
    shown = json.loads(deepline("runs", "show", "moved", "--json").stdout)
    rows = len(domains)
    assert (shown["maps"][0]["succeeded"], shown["stats"]["rows"]["succeeded"]) == (rows, rows), shown


NIGHTLY_PLAY = """\
import os

from deepline_cli import Column, play


def time_to_live(previous):
    return float(os.environ.get("LEADS_TTL", "86400"))  # a day; 0 once the night is over


async def find_email(row, rc):
    result = await rc.tools.execute("find", "people.alpha", {"first": row["first"], "domain": row["domain"]})
    return result.output["email"]


@play("nightly")
async def nightly(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", concurrency=1,
                         columns={"email": Column(find_email, stale_after_seconds=time_to_live)})
    return {"rows": len(rows)}
"""


def test_a_resume_replays_the_cells_its_run_took_from_an_earlier_run_once_they_went_stale(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """A nightly refresh takes yesterday's fresh cells as they are, is stopped, and is
    resumed after they went stale: staleness is judged once per run, so the resume replays
    what its run took and pays only for the rows it had not reached."""
    play = project(NIGHTLY_PLAY)
    header, ada, grace, *_ = LEADS.splitlines()
    (tmp_path / "pilot.csv").write_text("\n".join([header, ada, grace]) + "\n")
    assert finished(deepline("run", str(play), "--csv", "pilot.csv", "--json"))["status"] == "completed"
    assert provider.count() == 2
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "night", "--max-credits", "2", "--json")
    assert stopped.code == 1 and provider.count() == 4, stopped.stderr  # Ada, Grace taken; two paid; stopped
    done = finished(deepline("resume", "night", "--max-credits", "100", "--json", LEADS_TTL="0"))
    assert provider.count() == 5, [r.body for r in provider.requests]  # only the row it had not reached
    assert set(provider.billed.values()) == {1}
    assert done["stats"]["credits"] == 3
    assert {r["domain"]: r["email"] for r in exported(deepline, "night")}["cobol.dev"] == "grace@cobol.dev"


TWO_CHECKS_PLAY = """\
import os

from deepline_cli import Column, play


def time_to_live(name):
    def ttl(previous):  # a number of seconds from the environment, else forever
        return float(os.environ[name]) if name in os.environ else None
    return ttl


async def email(row, rc):
    return (await rc.tools.execute("find", "people.alpha", {"first": row["first"], "domain": row["domain"]})).output


async def check(row, rc):
    return (await rc.tools.execute("check", "people.beta", {"first": row["first"], "domain": row["domain"]})).output


@play("checked")
async def checked(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", columns={
        "email": Column(email, stale_after_seconds=time_to_live("EMAIL_TTL")),
        "check": Column(check, stale_after_seconds=time_to_live("CHECK_TTL")),
    })
    return {"rows": len(rows)}
"""


def test_a_resume_after_another_run_refreshed_what_it_paid_for_does_not_pay_again(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """Run B pays for a refresh and stops (its budget) before its row is written; run C
    refreshes the same answer. B's resume takes C's answer: B was answered once already,
    and a third payment would be a second one for B."""
    play = project(TWO_CHECKS_PLAY)
    now = {"EMAIL_TTL": "0"}  # every email asked again by each run
    header, ada, *_ = LEADS.splitlines()
    (tmp_path / "one.csv").write_text("\n".join([header, ada]) + "\n")
    stopped = deepline("run", str(play), "--csv", "one.csv", "--run-id", "B", "--max-credits", "1", "--json", **now)
    assert stopped.code == 1 and provider.count() == 1, stopped.stderr  # alpha paid, beta refused
    other = finished(deepline("run", str(play), "--csv", "one.csv", "--run-id", "C", "--json", **now))
    assert other["status"] == "completed"
    assert provider.count() == 3  # C: alpha refreshed (a fresh key), beta
    done = finished(deepline("resume", "B", "--max-credits", "10", "--json", **now))
    assert provider.count() == 3, [(r.path, r.headers.get("idempotency-key")) for r in provider.requests]
    assert done["stats"]["credits"] == 1
    assert [row["email"] for row in exported(deepline, "B")] == [row["email"] for row in exported(deepline, "C")]


def test_a_resume_given_force_refresh_refreshes_the_rows_its_run_took_from_an_earlier_run(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """What an attempt took from earlier runs is judged once per run, but a `--force-refresh`
    given to the resume (not to the attempt that took it) asks every call again."""
    play = project(EVERY_ROW_PLAY)
    header, ada, grace, *_ = LEADS.splitlines()
    (tmp_path / "pilot.csv").write_text("\n".join([header, ada, grace]) + "\n")
    assert finished(deepline("run", str(play), "--csv", "pilot.csv", "--json"))["status"] == "completed"
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "B", "--max-credits", "2", "--json")
    assert stopped.code == 1 and provider.count() == 4, stopped.stderr  # Ada, Grace taken from A; 2 paid; stopped
    finished(deepline("resume", "B", "--force-refresh", "--max-credits", "100", "--json"))
    taken = [r.body["domain"] for r in provider.requests[4:]]
    assert {"analytical.engine", "cobol.dev"} <= set(taken), taken  # asked again, under fresh keys
    assert set(provider.billed.values()) == {1}


def test_a_call_a_run_gave_back_unsent_is_not_its_own_on_resume(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """A call the budget refused before it went out was never the run's: another run paying
    for it meanwhile does not make that answer the run's own, and once stale it is asked."""
    play = project(TWO_CHECKS_PLAY)
    header, ada, *_ = LEADS.splitlines()
    (tmp_path / "one.csv").write_text("\n".join([header, ada]) + "\n")
    stopped = deepline("run", str(play), "--csv", "one.csv", "--run-id", "B", "--max-credits", "1", "--json")
    assert stopped.code == 1 and provider.count() == 1, stopped.stderr  # alpha paid; beta refused, unsent
    assert finished(deepline("run", str(play), "--csv", "one.csv", "--run-id", "C", "--json"))["status"] == "completed"
    assert provider.count() == 2  # C: alpha from B's receipt, beta paid
    finished(deepline("resume", "B", "--max-credits", "10", "--json", CHECK_TTL="0"))
    assert provider.count() == 3, [r.path for r in provider.requests]  # stale for B, never given to it


def test_one_map_name_used_twice_in_a_run_is_refused(deepline: Run, project: Callable[[str], Path]) -> None:
    """A map's name is the identity of its rows in the run: a second `ctx.map` of the same
    name (a loop over several lists) would be answered with the first one's rows. It fails,
    saying how to name each one."""
    play = project(
        EVERY_ROW_PLAY.replace(
            'rows = await ctx.map("leads", ctx.csv(input["csv"])',
            'await ctx.map("leads", [{"first": "Ada", "domain": "analytical.engine"}], key="domain",'
            ' columns={"email": find_email})\n    rows = await ctx.map("leads", ctx.csv(input["csv"])',
        )
    )
    result = deepline("run", str(play), "--csv", "leads.csv")
    assert result.code == 2, result.stderr
    assert "Map 'leads' ran already in this run" in result.stderr, result.stderr


# --- every answer a provider gives can be recorded -------------------------------------------

ODD_ANSWER_PLAY = """\
import json
from pathlib import Path

from deepline_cli import play, tool


@tool("bio.lookup", credits=5)
def bio(input):
    with Path("calls.log").open("a") as log:
        log.write(input["domain"] + "\\n")  # the provider bills this call
    # Python's json gives half an emoji as a lone surrogate; some ids are past 64 bits.
    return json.loads('{"bio": "Founder \\\\ud83d", "id": 18446744073709551616, "score": NaN}')


@play("odd-answers")
async def odd_answers(ctx, input):
    rows = await ctx.map("people", [{"domain": "acme.com"}], key="domain", columns={
        "bio": lambda row, rc: rc.tools.execute("bio", "bio.lookup", {"domain": row["domain"]}),
    })
    alone = await ctx.tools.execute("alone", "bio.lookup", {"domain": "globex.com"})
    return {"rows": len(rows), "alone": alone.output}
"""


def test_an_answer_json_cannot_hold_as_it_is_is_recorded_and_never_paid_again(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A tool's answer holding text with half an emoji (a lone surrogate, as Python's json
    reads a truncated string), an integer past 64 bits or NaN could not be recorded: every
    attempt paid for the call again and the run stayed 'running'. It is recorded as JSON
    can hold it (U+FFFD for the half emoji, null for NaN), once."""
    play = write_play(ODD_ANSWER_PLAY)
    first = finished(deepline("run", str(play), "--run-id", "odd", "--json"))
    assert first["output"]["alone"]["bio"] == "Founder \ufffd", first["output"]
    assert first["output"]["alone"]["id"] == 18446744073709551616 and first["output"]["alone"]["score"] is None
    assert (tmp_path / "calls.log").read_text().split() == ["acme.com", "globex.com"]
    rows = exported(deepline, "odd")
    assert rows[0]["bio"]["bio"] == "Founder \ufffd" and rows[0]["_error"] in (None, ""), rows
    again = finished(deepline("run", str(play), "--json"))  # a new run: every answer is reused
    assert again["output"] == first["output"]
    assert (tmp_path / "calls.log").read_text().split() == ["acme.com", "globex.com"]  # paid once each


@dataclass
class HalfEmojiProvider(Provider):
    """A provider whose JSON carries what Python's json reads and orjson refuses: an escaped
    lone surrogate (a bio cut mid-emoji) and an integer past 64 bits."""

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        self.billed[seen.headers.get("idempotency-key", "")] += 1
        return 200, {"content-type": "application/json"}, b'{"bio": "Founder \\ud83d", "id": 18446744073709551616}'


def _answered_twice(
    provider: Provider, deepline: Run, write_play: Callable[..., Path], tmp_path: Path, credits: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One HTTP tool call to `provider`, in two runs: each run's run.finished (the second
    reuses the first's answer)."""
    with ProviderServer(provider) as running:
        (tmp_path / "deepline.toml").write_text(f'[tools."p.one"]\nurl = "{running.url}/one"\ncredits = {credits}\n')
        play = write_play(
            """
            from deepline_cli import play

            @play("one")
            async def one(ctx, input):
                return (await ctx.tools.execute("one", "p.one", {"domain": "acme.com"})).output
            """
        )
        return finished(deepline("run", str(play), "--json")), finished(deepline("run", str(play), "--json"))


def test_an_http_answer_with_half_an_emoji_is_kept_not_refused_as_malformed(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """The provider was paid for that answer: "malformed JSON" (transient) asked again on
    every later run, and showed 0 credits. It is read as Python's json reads it, mended."""
    provider = HalfEmojiProvider()
    first, again = _answered_twice(provider, deepline, write_play, tmp_path, credits=2)
    assert first["output"] == {"bio": "Founder \ufffd", "id": 18446744073709551616}
    assert first["stats"]["credits"] == 2
    assert again["output"]["bio"] == "Founder \ufffd"
    assert list(provider.billed.values()) == [1]


@dataclass
class Latin1Provider(Provider):
    """A provider answering JSON in the charset it declares: ISO-8859-1."""

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        self.billed[seen.headers.get("idempotency-key", "")] += 1
        body = '{"name": "René Müller"}'.encode("iso-8859-1")
        return 200, {"content-type": "application/json; charset=iso-8859-1"}, body


def test_an_http_answer_in_its_declared_charset_is_read_not_refused_as_malformed(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """JSON sent as `charset=iso-8859-1` was read as UTF-8, refused as malformed (transient),
    and asked again, paid, on every run. It is read in the charset it declares, once."""
    provider = Latin1Provider()
    first, again = _answered_twice(provider, deepline, write_play, tmp_path, credits=1)
    assert first["output"] == again["output"] == {"name": "René Müller"}
    assert list(provider.billed.values()) == [1]


# --- a resume keeps the refresh the run was started with --------------------------------

SERIAL_PLAY = EVERY_ROW_PLAY.replace('return result.output["email"]', 'return result.output["serial"]')


def test_a_resumed_force_refresh_refreshes_the_rows_it_had_not_reached(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    """`deepline resume` (the command the run itself suggests) continued a `--force-refresh`
    run without it: the rows the first attempt had not reached kept yesterday's answers."""
    play = project(SERIAL_PLAY)
    assert deepline("run", str(play), "--csv", "leads.csv").code == 0  # yesterday: serials 1-5
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "fresh", "--force-refresh",
                       "--max-credits", "2")  # fmt: skip
    assert stopped.code == 1, stopped.stderr
    done = finished(deepline("resume", "fresh", "--max-credits", "100", "--json"))
    assert done["stats"]["credits"] == 5
    assert sorted(row["email"] for row in exported(deepline, "fresh")) == [6, 7, 8, 9, 10]
    assert provider.count() == 10 and set(provider.billed.values()) == {1}


def test_a_resumed_refresh_failed_tries_the_failed_rows_it_had_not_reached(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider
) -> None:
    play = project(SERIAL_PLAY)
    provider.script("/alpha/find", ["404"] * 5)  # yesterday the provider refused every row
    assert deepline("run", str(play), "--csv", "leads.csv").code == 0
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "again", "--refresh-failed",
                       "--max-credits", "2")  # fmt: skip
    assert stopped.code == 1, stopped.stderr
    done = finished(deepline("resume", "again", "--max-credits", "100", "--json"))
    assert done["stats"]["rows"]["failed"] == 0, done["stats"]
    assert sorted(row["email"] for row in exported(deepline, "again")) == [1, 2, 3, 4, 5]


# --- a map column named like an input column -------------------------------------------------

FILL_PLAY = """\
from deepline_cli import Column, play, tool


@tool("finder.email", credits=1)
def finder(input):
    return {"email": f"{input['first'].lower()}@{input['domain']}"}


async def find_email(row, rc):
    found = await rc.tools.execute("find", "finder.email", {"first": row["first"], "domain": row["domain"]})
    return found.get("email")


@play("fill-missing")
async def fill(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", columns={
        "email": Column(find_email, run_if=lambda row: not row["email"]),  # pay only where it is blank
        "contact": lambda row: f"{row['first']} <{row['email']}>",
    })
    return {"with_email": sum(1 for row in rows if row["email"])}
"""


def test_a_column_filling_an_input_column_keeps_the_values_it_did_not_compute(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """ "Fill `email` where it is blank": the rows that had an email kept none (in the
    result, the export and the store), and later columns saw None. A column named like an
    input column replaces its value where it computes one; where `run_if` says no, the
    input's value stands."""
    (tmp_path / "leads.csv").write_text("first,domain,email\nAda,acme.com,ada.l@acme.com\nBob,globex.com,\n")
    play = write_play(FILL_PLAY)
    done = finished(deepline("run", str(play), "--csv", "leads.csv", "--run-id", "fill", "--json"))
    assert done["output"] == {"with_email": 2}
    assert done["stats"]["credits"] == 1  # only Bob's was looked up
    rows = exported(deepline, "fill")
    assert [(r["email"], r["contact"]) for r in rows] == [
        ("ada.l@acme.com", "Ada <ada.l@acme.com>"),
        ("bob@globex.com", "Bob <bob@globex.com>"),
    ]
    csv_out = deepline("export", "fill").stdout.splitlines()
    assert csv_out[0] == "first,domain,email,contact,_error" and csv_out[1].startswith("Ada,acme.com,ada.l@acme.com,")


FAILING_FILL_PLAY = """\
from deepline_cli import play


def enrich_email(row):
    if row["domain"] == "bad.com":
        raise ValueError("provider said no")
    return "new@" + row["domain"]


@play("failing-fill")
async def failing_fill(ctx, input):
    rows = [{"domain": "ok.com", "email": "orig@ok.com"}, {"domain": "bad.com", "email": "orig@bad.com"}]
    done = await ctx.map("m", rows, key="domain", columns={"email": enrich_email})
    return [row["email"] for row in done]
"""


def test_a_failed_column_named_like_an_input_column_leaves_the_inputs_value(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """The CRM's email of the row whose lookup failed came back empty (in the result and
    the export): a failed cell computed no value, so the input's stands, as where the row
    failed before the column."""
    play = write_play(FAILING_FILL_PLAY)
    done = finished(deepline("run", str(play), "--run-id", "ff", "--json"))
    assert done["output"] == ["new@ok.com", "orig@bad.com"]
    rows = exported(deepline, "ff")
    assert [(r["email"], bool(r["_error"])) for r in rows] == [("new@ok.com", False), ("orig@bad.com", True)]


ERROR_FIELD_PLAY = """\
from deepline_cli import play


def score(row):
    if row["domain"] == "bad.example":
        raise ValueError("no such company")
    return len(row["domain"])


@play("chained")
async def chained(ctx, input):
    first = await ctx.map("first", [{"domain": "acme.com"}, {"domain": "bad.example"}], key="domain",
                          columns={"score": score})
    second = await ctx.map("second", list(first), key="domain", columns={"checked": lambda row: True})
    return {"second_failed": second.failed_count}
"""


def test_an_input_field_named_error_does_not_make_a_second_error_column(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """A map over another map's rows (a failed one carries `_error`), or over an earlier
    export: the export had two `_error` columns and a row that succeeded showed an error.
    `_error` is the map's own: the row's failure in this map, or empty."""
    play = write_play(ERROR_FIELD_PLAY)
    done = finished(deepline("run", str(play), "--run-id", "chain", "--json"))
    assert done["output"] == {"second_failed": 0}
    lines = deepline("export", "chain", "--map", "second").stdout.splitlines()
    assert lines[0].split(",").count("_error") == 1, lines[0]
    rows = [r for r in deepline("export", "chain", "--map", "second", "--format", "jsonl").json_lines()]
    assert [r["_error"] for r in rows] == [None, None], rows


LIST_PLAY = """\
from deepline_cli import play, tool


@tool("t.email", credits=1)
def email(input):
    return "x@" + input["domain"]


@play("from-a-list")
async def from_a_list(ctx, input):
    rows = [{"name": f"n{i}", "domain": f"d{i}.com"} for i in range(6)]  # rows from an API, not a CSV
    done = await ctx.map("m", rows, key="domain", concurrency=1,
                         columns={"email": lambda row, rc: rc.tools.execute("e", "t.email", {"domain": row["domain"]})})
    return {"rows": len(done)}
"""


def test_the_partial_export_of_a_stopped_map_over_a_list_keeps_its_input_columns(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    play = write_play(LIST_PLAY)
    assert deepline("run", str(play), "--run-id", "part", "--max-credits", "3").code == 1
    partial = deepline("export", "part")
    assert partial.code == 0, partial.stderr
    assert partial.stdout.splitlines()[:2] == ["name,domain,email,_error", "n0,d0.com,x@d0.com,"]
    assert "this export is partial" in partial.stderr


BLANK_KEY_PLAY = """\
from deepline_cli import play, tool


@tool("t.company", credits=1)
def company(input):
    with open("calls.log", "a") as log:
        log.write(input["name"] + "\\n")
    return {"company": input["name"] + "'s company"}


@play("blank-keys")
async def blank_keys(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="email", concurrency=1, columns={
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"name": row["name"]}),
    })
    return {"names": sorted(row["name"] for row in rows)}
"""


def test_a_resume_over_moved_rows_with_blank_keys_finishes_each_once(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """Rows with a blank key are keyed by where they are (`leads.csv line 2`): that is no
    identity across attempts. After the sheet was sorted again, the row now at line 2 was
    taken for the one an earlier attempt finished there: one row twice, one never done."""
    play = write_play(BLANK_KEY_PLAY)
    (tmp_path / "leads.csv").write_text("name,email\nAda,\nBob,\nCy,cy@x.com\n")
    stopped = deepline("run", str(play), "--csv", "leads.csv", "--run-id", "bk", "--max-credits", "1")
    assert stopped.code == 1, stopped.stderr  # Ada (line 2) done, then the budget stops the map
    (tmp_path / "leads.csv").write_text("name,email\nBob,\nAda,\nCy,cy@x.com\n")  # Bob moved up
    done = finished(deepline("resume", "bk", "--max-credits", "10", "--json"))
    assert done["output"] == {"names": ["Ada", "Bob", "Cy"]}
    assert sorted((tmp_path / "calls.log").read_text().split()) == ["Ada", "Bob", "Cy"]  # each paid once


REFRESH_FAILED_PLAY = """\
from deepline_cli import ToolExecutionError, play, tool


@tool("t.person", credits=1)
def person(input):
    with open("calls.log", "a") as log:
        log.write(str(input["n"]) + "\\n")
    if input["n"] % 3 == 0:
        raise ToolExecutionError("no such person", category="validation", retryable=False)
    return {"n": input["n"]}


@play("people")
async def people(ctx, input):
    rows = await ctx.map("people", [{"n": n} for n in range(90)], key="n", concurrency=1, columns={
        "person": lambda row, rc: rc.tools.execute("p", "t.person", {"n": row["n"]}),
    })
    return {"rows": len(rows), "failed": rows.failed_count}
"""


def test_a_resumed_refresh_of_failures_is_not_stopped_as_systemic(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A `--refresh-failed` run stopped part-way, then resumed: the failures it had refreshed
    already are replayed from their receipts (no call), and were counted as the map's "first
    20 rows all failing the same way": the resume stopped, and its own advice paid again."""
    play = write_play(REFRESH_FAILED_PLAY)
    assert finished(deepline("run", str(play), "--json"))["output"] == {"rows": 90, "failed": 30}
    refresh = deepline("run", str(play), "--run-id", "rf", "--refresh-failed", "--max-tool-calls", "25", "--json")
    assert refresh.code == 1, refresh.stderr  # stopped after 25 of the 30 failures
    done = finished(deepline("resume", "rf", "--max-tool-calls", "1000", "--json"))
    assert done["output"] == {"rows": 90, "failed": 30}
    calls = (tmp_path / "calls.log").read_text().split()
    assert len(calls) == 90 + 30  # the first run, then each failure refreshed once


# --- a provider outage: rows it failed are asked again by the next run -------------------------

OUTAGE_PLAY = """\
from deepline_cli import play

@play("outage")
async def outage(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", on_row_error="fail", columns={
        "answer": lambda row, rc: rc.tools.execute(
            "find", "people.alpha", {"first": row["first"], "domain": row["domain"]}),
    })
    return {"rows": len(rows), "failed": rows.failed_count}
"""


def test_rows_a_provider_outage_failed_are_asked_again_by_the_resume(
    deepline: Run, project: Callable[[str], Path], provider: DirectoryProvider, tmp_path: Path
) -> None:
    """The provider answers 503 to a nightly CI run (its retries spent: the rows fail,
    transient; the map stops). Once it is back, CI runs the same command again: the resume
    asks those rows again, under the keys they were first sent with (SPEC §3), and
    completes. It completed with the rows failed for good, which only --refresh-failed,
    unknown to CI, asked again. A later run keeps a failed cell (SPEC §2)."""
    play = project(OUTAGE_PLAY)
    toml = tmp_path / "deepline.toml"
    toml.write_text(toml.read_text().replace("credits = 1\n", "credits = 1\nretries = 0\n", 1))
    command = ("run", str(play), "--csv", "leads.csv", "--run-id", "nightly", "--json")
    provider.default_fault = "503"
    down = deepline(*command)
    assert down.code == 1, down.stderr
    keys = {r.headers["idempotency-key"] for r in provider.requests}
    assert keys
    provider.default_fault = "ok"
    provider.requests.clear()

    back = finished(deepline(*command))

    assert back["output"] == {"rows": 5, "failed": 0}
    assert keys <= {r.headers["idempotency-key"] for r in provider.requests}  # the same keys again
    assert len(provider.requests) == 5


# --- a cell is recomputed when the configuration its column reads changes ----------------------

CONFIG_PLAY = """\
import functools

from deepline_cli import play
from settings import PROVIDER, WEIGHTS


class Enricher:
    def __init__(self, provider):
        self.provider = provider

    def via(self, row, rc):
        return self.provider


def tagged(row, rc, tag):
    return tag


def make(config):
    def fn(row, rc):
        return config["provider"]
    return fn


@play("config")
async def config(ctx, input):
    rows = await ctx.map("m", [{"id": "1", "tier": "gold"}], key="id", columns={
        "imported_const": lambda row, rc: PROVIDER,
        "imported_dict": lambda row, rc: WEIGHTS[row["tier"]],
        "instance": Enricher("hunter").via,
        "partial": functools.partial(tagged, tag="hunter"),
        "dict_closure": make({"provider": "hunter"}),
    })
    return {k: v for k, v in list(rows)[0].items() if k not in ("id", "tier")}
"""


def test_a_cell_is_recomputed_when_the_configuration_its_column_reads_changes(
    deepline_process: Run, tmp_path: Path
) -> None:
    """Values a column reads from a settings module, an object's attributes, a partial's
    arguments or a closure's dict: changed, the cells are computed again (they came back
    with the old values); unchanged, each new process (another hash seed) reuses them."""
    (tmp_path / "settings.py").write_text('PROVIDER = "hunter"\nWEIGHTS = {"gold": 3}\n')
    (tmp_path / "play.py").write_text(CONFIG_PLAY)
    first = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="1"))
    assert set(first["output"].values()) == {"hunter", 3}, first["output"]
    again = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="2"))
    assert again["stats"]["rows"]["reused"] == 1, again["stats"]

    (tmp_path / "settings.py").write_text('PROVIDER = "apollo"\nWEIGHTS = {"gold": 30}\n')
    (tmp_path / "play.py").write_text(CONFIG_PLAY.replace('"hunter"', '"apollo"'))
    changed = finished(deepline_process("run", "play.py", "--json"))

    assert changed["output"] == {
        "imported_const": "apollo", "imported_dict": 30, "instance": "apollo", "partial": "apollo",
        "dict_closure": "apollo",
    }  # fmt: skip


SEEDED_PLAY = """\
from datetime import datetime, timezone

from deepline_cli import play

BLOCKED = {"info", "sales", "admin", "team", "hello"}


class Filter:
    def __init__(self):
        self.skip = list(set(BLOCKED))  # in the hash seed's order
        self.started_at = datetime.now(timezone.utc)  # different in every process

    def keep(self, row, rc):
        return row["first"].lower() not in self.skip


def make(tiers):
    def tier(row, rc):
        return len(tiers)
    return tier


@play("seeded")
async def seeded(ctx, input):
    rows = await ctx.map("m", [{"id": "1", "first": "Ada"}], key="id", columns={
        "keep": Filter().keep,
        "tier": make(list({"gold", "silver", "bronze"})),
    })
    return len(rows)
"""


def test_a_fingerprint_holds_nothing_that_changes_with_the_process(deepline_process: Run, tmp_path: Path) -> None:
    """Data whose order follows the hash seed (a list made from a set) or that differs in
    every process (a time): each new process recomputed the cells (and a resolver's
    `rc.fetch` was paid again). Every later run, under another seed, reuses them."""
    (tmp_path / "play.py").write_text(SEEDED_PLAY)
    finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="1"))
    for seed in ("2", "3", "4"):
        again = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED=seed))
        assert again["stats"]["rows"]["reused"] == 1, (seed, again["stats"]["rows"])


FOLLOWED_PLAY = """\
from deepline_cli import play
from settings import LABEL, TIER

MIN_LEN = 3
RULES = {"min": MIN_LEN}


@play("followed")
async def followed(ctx, input):
    rows = await ctx.map("m", [{"id": "1"}], key="id", columns={
        "tier": lambda row: TIER,
        "label": lambda row: LABEL,
        "min": lambda row: RULES["min"],
    })
    return {k: v for k, v in list(rows)[0].items() if k != "id"}
"""

SETTINGS = """\
PROD = True
DEFAULT_TIER = "gold"
TIER = DEFAULT_TIER
if PROD:
    LABEL = "prod-v1"
else:
    LABEL = "dev"
"""


def test_a_cell_follows_the_names_a_setting_is_computed_from(deepline_process: Run, tmp_path: Path) -> None:
    """`TIER = DEFAULT_TIER`, a `LABEL` set in an `if`, `RULES = {"min": MIN_LEN}`: an edit
    of DEFAULT_TIER, of the `if`, or of MIN_LEN came back with the old values."""
    (tmp_path / "settings.py").write_text(SETTINGS)
    (tmp_path / "play.py").write_text(FOLLOWED_PLAY)
    first = finished(deepline_process("run", "play.py", "--json"))
    assert first["output"] == {"tier": "gold", "label": "prod-v1", "min": 3}
    same = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="7"))
    assert same["stats"]["rows"]["reused"] == 1

    (tmp_path / "settings.py").write_text(SETTINGS.replace('"gold"', '"silver"').replace("prod-v1", "prod-v2"))
    (tmp_path / "play.py").write_text(FOLLOWED_PLAY.replace("MIN_LEN = 3", "MIN_LEN = 7"))
    changed = finished(deepline_process("run", "play.py", "--json"))

    assert changed["output"] == {"tier": "silver", "label": "prod-v2", "min": 7}


CLASSES_PLAY = """\
from enum import Enum

import settings
from deepline_cli import play
from settings import CHAINED

try:
    from settings import TRIED
except ImportError:
    TRIED = "bronze"


class Cfg:
    TIER = "gold"


class Tier(str, Enum):
    DEFAULT = "gold"


MODULE_TIER = settings.TIER
RULES = {}
RULES.update(tier="gold")
FIELDS = ["a"]
FIELDS.append("gold")


def make(fields):
    def count(row):
        return len(fields)
    return count


@play("classes")
async def classes(ctx, input):
    rows = await ctx.map("m", [{"id": "1"}], key="id", columns={
        "cls": lambda row: Cfg.TIER,
        "enum": lambda row: Tier.DEFAULT.value,
        "mod": lambda row: MODULE_TIER,
        "chain": lambda row: CHAINED,
        "tried": lambda row: TRIED,
        "upd": lambda row: RULES["tier"],
        "app": lambda row: FIELDS[-1],
        "tup": make(tuple({"email", "phone", "title", "company", "linkedin"})),
    })
    return {k: v for k, v in list(rows)[0].items() if k != "id"}
"""


def test_a_cell_follows_class_attributes_modules_and_mutations_and_not_the_hash_seed(
    deepline_process: Run, tmp_path: Path
) -> None:
    """Class attributes and an Enum's members, a setting read through `import settings`, one
    computed in settings from another module, one imported in a `try`, a dict updated and a
    list appended to at module level: edited, they came back with the old values. A tuple
    made from a set: every process recomputed it."""
    (tmp_path / "base.py").write_text('DEFAULT = "gold"\n')
    (tmp_path / "settings.py").write_text('import base\n\nTIER = "gold"\nCHAINED = base.DEFAULT\nTRIED = "gold"\n')
    (tmp_path / "play.py").write_text(CLASSES_PLAY)
    first = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="1"))
    assert set(first["output"].values()) == {"gold", 5}, first["output"]
    for seed in ("2", "3"):
        again = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED=seed))
        assert again["stats"]["rows"]["reused"] == 1, (seed, again["stats"]["rows"])

    for name in ("base.py", "settings.py", "play.py"):
        (tmp_path / name).write_text((tmp_path / name).read_text().replace('"gold"', '"silver"'))
    changed = finished(deepline_process("run", "play.py", "--json", PYTHONHASHSEED="4"))

    assert {k: v for k, v in changed["output"].items() if k != "tup"} == dict.fromkeys(
        ["cls", "enum", "mod", "chain", "tried", "upd", "app"], "silver"
    ), changed["output"]


def test_a_closure_holding_a_tuple_with_nan_has_a_fingerprint() -> None:
    """A tuple in a closure is hashed in no order: sorting its members by their JSON raised
    on NaN, and the map failed before its first row."""
    from deepline_cli.runtime.map.columns import code_fingerprint

    def make(weights: tuple[float | str, ...]) -> Callable[[dict[str, Any]], Any]:
        def score(row: dict[str, Any]) -> Any:
            return weights

        return score

    nan_first = code_fingerprint(make((float("nan"), 1.0, "a")))
    assert nan_first == code_fingerprint(make((1.0, "a", float("nan"))))
    assert nan_first != code_fingerprint(make((2.0, "a", float("nan"))))


# --- a local tool's answer is the same live and replayed -------------------------------------

KINDS_PLAY = """\
import datetime
import math

from deepline_cli import play, tool


@tool("local.kinds")
def kinds(input):
    n = input["n"]
    return {
        "tags": {f"t{n}", "shared"},
        "pair": (n, "x"),
        "when": datetime.date(2026, 1, n),
        "ratio": math.nan,
        "nested": [{"seen": frozenset({n})}],
    }


@play("kinds")
async def kinds_play(ctx, input):
    answer = (await ctx.tools.execute("kinds", "local.kinds", {"n": 3})).output
    return {name: [type(value).__name__, value] for name, value in sorted(answer.items())}
"""


def test_a_local_tools_answer_is_the_same_live_and_replayed(deepline: Run, write_play: Callable[..., Path]) -> None:
    """A Python tool's answer reaches the play as its receipt holds it: a set, a tuple, a
    date and NaN live are what a replay of the receipt gives (a list, a list, text, None),
    so a play never behaves differently on a later run or a resume."""
    play = write_play(KINDS_PLAY)
    live = finished(deepline("run", str(play), "--json"))
    replayed = finished(deepline("run", str(play), "--json"))
    assert replayed["stats"]["tools"]["local.kinds"]["reused"] == 1
    assert live["output"] == replayed["output"]
    assert live["output"]["tags"] == ["list", ["shared", "t3"]]
    assert live["output"]["when"] == ["str", "2026-01-03"]
    assert live["output"]["ratio"] == ["NoneType", None]


# --- a map that stops sends nothing more ---------------------------------------------------

STOPPING_PLAY = """\
import asyncio
from deepline_cli import play, tool


@tool("slow.lookup", credits=1, concurrency=1)
async def lookup(input):
    with open(input["log"], "a") as f:
        f.write(input["domain"] + "\\n")
    await asyncio.sleep(0.05)
    return {"name": input["domain"]}


@play("stopping")
async def stopping(ctx, input):
    rows = [{"domain": f"n{i}.com"} for i in range(60)]

    async def name(row, rc):
        found = await rc.tools.execute("l", "slow.lookup", {"domain": row["domain"], "log": input["log"]})
        return found.output["nope"]  # a typo: KeyError on the first row that gets an answer

    return len(await ctx.map("m", rows, key="domain", columns={"name": name}))
"""


def test_a_map_stopped_by_a_play_bug_sends_none_of_the_calls_waiting_for_a_slot(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A tool of concurrency 1 and 50 rows waiting for its slot when the first answer hits
    a typo in the resolver: the map stops and the rows still waiting send nothing (they
    were not sent, so nothing of them is paid or kept), as its message says."""
    play = write_play(STOPPING_PLAY)
    log = tmp_path / "calls.log"
    result = deepline("run", str(play), "--input", json.dumps({"log": str(log)}))
    assert result.code == 1, result.stderr
    assert "nothing more was called" in result.stderr
    sent = log.read_text().split()
    assert len(sent) <= 2, sent  # the first, and at most one that had its slot already


@dataclass
class NginxDownProvider(Provider):
    """A provider behind nginx whose upstream is down: 502 with nginx's HTML page, CRLFs."""

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        self.billed[seen.headers.get("idempotency-key", "")] += 1
        page = (
            "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
            "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
        )
        return 502, {"content-type": "text/html"}, page.encode()


def test_an_html_error_page_is_said_in_one_line_by_its_title(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A 502 page from a web server in front of the provider: the row's error and the log
    say `502 from …: 502 Bad Gateway`, one line, not the page's markup and carriage returns."""
    with ProviderServer(NginxDownProvider()) as provider:
        (tmp_path / "deepline.toml").write_text(
            f'[tools."ng.find"]\nurl = "{provider.url}/find"\nretries = 0\ncredits = 1\n'
        )
        play = write_play(
            """
            from deepline_cli import play

            @play("ng")
            async def ng(ctx, input):
                rows = await ctx.map("m", [{"d": "acme.com"}], key="d",
                                     columns={"e": lambda row, rc: rc.tools.execute("e", "ng.find", row)})
                return rows.failed_count
            """
        )
        result = deepline("run", str(play), "--run-id", "ng")
        assert result.code == 0, result.stderr
        failed = [line for line in result.stderr.splitlines() if "failed:" in line]
        assert failed and failed[0].endswith("502 from ng.find: 502 Bad Gateway"), result.stderr
        assert "<html" not in result.stderr and "\\x0d" not in result.stderr


# --- a class's code reaches its cells: methods it calls through self, and its base classes ------

CLASS_HELPERS = """\
class Enricher:
    def __init__(self, prefix):
        self.prefix = prefix

    def go(self, row, rc):
        return self.prefix + row["name"] + self.tag()

    def tag(self):
        return "!"


class Base:
    def bump(self, n):
        return n + 1


class Sub(Base):
    pass
"""

CLASS_PLAY = """\
from collections import defaultdict

from deepline_cli import play
from hh import Enricher, Sub


@play("classes")
async def classes(ctx, input):
    held = Enricher("c:")
    several = [Enricher("l:"), Sub()]
    by_name = defaultdict(list, {"e": Enricher("d:")})  # a dict of a kind of its own
    columns = {  # a map each: a cell recomputed makes the cells after it recomputed too
        "bound": Enricher("b:").go,
        "inherited": lambda row, rc: Sub().bump(row["n"]),
        "closure": lambda row, rc: held.go(row, rc),
        "listed": lambda row, rc: several[0].go(row, rc) + str(several[1].bump(0)),
        "keyed": lambda row, rc: by_name["e"].go(row, rc),
    }
    out = {}
    for name, fn in columns.items():
        rows = await ctx.map(name, [{"name": "x", "n": 1}], key="name", columns={name: fn})
        out[name] = list(rows)[0][name]
    return out
"""


def test_an_edit_of_a_method_a_column_reaches_through_its_class_recomputes_the_cell(
    deepline_process: Run, tmp_path: Path
) -> None:
    """A bound method's resolver calling another method through `self`, a method inherited
    from a base class, an object a closure holds (alone, in a list, in a dict): an edit of
    the method the cell runs gave the old value back on the next night (the class was not
    in the fingerprint)."""
    (tmp_path / "hh.py").write_text(CLASS_HELPERS)
    (tmp_path / "play.py").write_text(CLASS_PLAY)
    first = finished(deepline_process("run", "play.py", "--json"))
    assert first["output"] == {"bound": "b:x!", "inherited": 2, "closure": "c:x!", "listed": "l:x!1", "keyed": "d:x!"}
    again = finished(deepline_process("run", "play.py", "--json"))
    assert again["stats"]["rows"]["reused"] == 5, again["stats"]  # unchanged: every cell reused

    (tmp_path / "hh.py").write_text(CLASS_HELPERS.replace('return "!"', 'return "?"').replace("n + 1", "n + 100"))
    edited = finished(deepline_process("run", "play.py", "--json"))

    assert edited["output"] == {
        "bound": "b:x?", "inherited": 101, "closure": "c:x?", "listed": "l:x?100", "keyed": "d:x?",
    }  # fmt: skip


DROPPED_PLAY = """\
from deepline_cli import play
from cfg import MULT


@play("dropped")
async def dropped(ctx, input):
    rows = await ctx.map("m", [{"name": "x", "n": "1"}, {"name": "y", "n": "150"}], key="name", columns={
        "base": lambda row, rc: int(row["n"]) * MULT,
        "double": lambda row, rc: row["base"] * 2,
    })
    return [dict(r) for r in rows]
"""


def test_a_column_dropped_for_a_night_and_restored_is_computed_from_the_values_it_follows(
    deepline_process: Run, tmp_path: Path
) -> None:
    """Night 2 recomputes `base` (its code changed) without `double` (commented out); night
    3 restores `double`: it came back with night 1's value, computed from the old `base`."""
    (tmp_path / "cfg.py").write_text("MULT = 1\n")
    (tmp_path / "play.py").write_text(DROPPED_PLAY)
    assert [r["double"] for r in finished(deepline_process("run", "play.py", "--json"))["output"]] == [2, 300]
    (tmp_path / "cfg.py").write_text("MULT = 10\n")
    (tmp_path / "play.py").write_text(DROPPED_PLAY.replace('        "double"', '        # "double"'))
    assert [r["base"] for r in finished(deepline_process("run", "play.py", "--json"))["output"]] == [10, 1500]
    (tmp_path / "play.py").write_text(DROPPED_PLAY)

    restored = finished(deepline_process("run", "play.py", "--json"))

    assert [(r["base"], r["double"]) for r in restored["output"]] == [(10, 20), (1500, 3000)]


INPUT_DROPPED_PLAY = """\
from deepline_cli import play


@play("input-dropped")
async def input_dropped(ctx, input):
    rows = await ctx.map("m", ctx.csv("people.csv"), key="id", columns={
        "company": lambda row, rc: "acme",
        "email": lambda row, rc: f"{row['who']}@{row['company']}",
    })
    return [dict(r) for r in rows]
"""


def test_a_column_dropped_while_its_rows_input_changed_is_computed_from_the_new_input(
    deepline_process: Run, tmp_path: Path
) -> None:
    """Night 2: the row's input changed (bob → alice) while `email` was commented out, and
    `company` computed the same value again; night 3 restored `email` as bob@acme."""
    (tmp_path / "play.py").write_text(INPUT_DROPPED_PLAY)
    (tmp_path / "people.csv").write_text("id,who\nx,bob\n")
    assert finished(deepline_process("run", "play.py", "--json"))["output"][0]["email"] == "bob@acme"
    (tmp_path / "play.py").write_text(INPUT_DROPPED_PLAY.replace('        "email"', '        # "email"'))
    (tmp_path / "people.csv").write_text("id,who\nx,alice\n")
    finished(deepline_process("run", "play.py", "--json"))
    (tmp_path / "play.py").write_text(INPUT_DROPPED_PLAY)

    restored = finished(deepline_process("run", "play.py", "--json"))

    assert restored["output"][0]["email"] == "alice@acme"


STATEFUL_PLAY = """\
from deepline_cli import play


class Counter:
    def __init__(self):
        self.calls = 0

    def bump(self, row):
        self.calls += 1  # state that changes as the play runs: not what the cell means
        return row["id"].upper()


@play("stateful")
async def stateful(ctx, input):
    counter = Counter()
    root = {"name": "root", "kids": []}
    root["kids"].append({"name": "kid", "parent": root})  # a tree with parent links
    first = await ctx.map("a", [{"id": "x"}, {"id": "y"}], key="id", columns={"v": lambda row, rc: counter.bump(row)})
    second = await ctx.map("b", [{"id": "x"}, {"id": "y"}], key="id", columns={
        "v": lambda row, rc: counter.bump(row) + root["kids"][0]["name"],
    })
    return [len(first), len(second)]
"""


def test_objects_in_a_closure_count_by_their_class_not_their_state_and_a_cyclic_tree_is_fine(
    deepline_process: Run, tmp_path: Path
) -> None:
    """An object whose attributes change as the play runs made map b's fingerprint depend on
    how many rows map a ran (every row recomputed on the next run); a closure's tree with
    parent links failed the run with RecursionError."""
    (tmp_path / "play.py").write_text(STATEFUL_PLAY)
    first = finished(deepline_process("run", "play.py", "--json"))
    assert first["output"] == [2, 2]
    again = finished(deepline_process("run", "play.py", "--json"))
    assert again["stats"]["rows"]["reused"] == 4, again["stats"]["rows"]


def test_a_column_added_while_another_is_dropped_keeps_the_dropped_columns_cells(
    deepline_process: Run, tmp_path: Path
) -> None:
    """Adding a column on the night another was commented out dropped that one's cells on
    every row, though nothing it was computed from had changed: restored, it was computed
    again (a stale tool call paid again)."""
    (tmp_path / "cfg.py").write_text("MULT = 1\n")
    (tmp_path / "play.py").write_text(DROPPED_PLAY)
    finished(deepline_process("run", "play.py", "--json"))
    added = DROPPED_PLAY.replace(
        '        "double"', '        "triple": lambda row, rc: row["base"] * 3,\n        # "double"'
    )
    (tmp_path / "play.py").write_text(added)
    finished(deepline_process("run", "play.py", "--json"))
    (tmp_path / "play.py").write_text(DROPPED_PLAY)

    restored = finished(deepline_process("run", "play.py", "--json"))

    assert restored["stats"]["rows"]["reused"] == 2, restored["stats"]["rows"]


# --- what a resolver was made with ----------------------------------------------------------


def test_a_fingerprint_follows_what_a_resolver_was_made_with() -> None:
    """Edits a go-to-market engineer makes to what a resolver was built with, each of which
    kept the old cells: a set or a list in a closure, a default argument, a partial's
    argument or an attribute; a config dict holding a list; the second of two resolvers one
    factory made; an Enum member, a compiled pattern, a frozen dataclass; a slots object's
    attribute; a setting in a module the play's helper module imports."""
    import enum
    import functools
    import re
    from dataclasses import dataclass as dc

    from deepline_cli.runtime.map.columns import code_fingerprint as fp

    def closure(value: Any) -> Callable[[dict[str, Any]], Any]:
        def resolve(row: dict[str, Any]) -> Any:
            return value

        return resolve

    def defaulted(value: Any) -> Callable[[dict[str, Any]], Any]:
        def resolve(row: dict[str, Any], rc: Any = None, skip: Any = value) -> Any:
            return skip

        return resolve

    def pick(row: dict[str, Any], titles: Any) -> Any:
        return titles

    class Slotted:
        __slots__ = ("titles",)

        def __init__(self, titles: Any) -> None:
            self.titles = titles

        def resolve(self, row: dict[str, Any]) -> Any:
            return self.titles

    class Tier(enum.Enum):
        GOLD = "gold"
        SILVER = "silver"

    @dc(frozen=True)
    class Config:
        provider: str
        min_score: int

    def siblings(second: str) -> Callable[[dict[str, Any]], Any]:
        def make_check(provider: str) -> Callable[[dict[str, Any]], Any]:
            def check(row: dict[str, Any]) -> Any:
                return provider

            return check

        first, other = make_check("apollo"), make_check(second)

        def checks(row: dict[str, Any]) -> Any:
            return [first(row), other(row)]

        return checks

    def finder(provider: str) -> Callable[[dict[str, Any]], Any]:
        def find(row: dict[str, Any]) -> Any:
            return provider

        return find

    pairs = {
        "set in a closure": (closure({"gmail.com", "yahoo.com"}), closure({"gmail.com", "aol.com"})),
        "list in a closure": (closure(["CEO", "CTO"]), closure(["CEO", "CFO"])),
        "dict holding a list": (closure({"titles": ["CEO"], "min": 1}), closure({"titles": ["CTO"], "min": 1})),
        "set as a default": (defaulted({"gmail.com"}), defaulted({"aol.com"})),
        "set in a partial": (functools.partial(pick, titles={"CEO"}), functools.partial(pick, titles={"CTO"})),
        "slots attribute": (Slotted({"CEO"}).resolve, Slotted({"CTO"}).resolve),
        "enum member": (defaulted(Tier.GOLD), defaulted(Tier.SILVER)),
        "compiled pattern": (defaulted(re.compile(r"^ceo$")), defaulted(re.compile(r"^cto$"))),
        "pattern flags": (defaulted(re.compile("ceo")), defaulted(re.compile("ceo", re.IGNORECASE))),
        "frozen dataclass": (closure(Config("hunter", 80)), closure(Config("hunter", 95))),
        "a factory's second resolver": (siblings("hunter"), siblings("clearbit")),
        "a function in a partial's tuple": (
            functools.partial(pick, titles=(finder("hunter"), finder("apollo"))),
            functools.partial(pick, titles=(finder("hunter"), finder("clearbit"))),
        ),
        "a function in a closure's dict": (closure({"com": finder("a")}), closure({"com": finder("b")})),
    }
    same = [what for what, (before, after) in pairs.items() if fp(before) == fp(after)]
    assert same == [], f"kept the old cells after an edit of: {same}"
    # and what is the same in every process is the same: a set's order is the hash seed's
    assert fp(closure({"gmail.com", "yahoo.com", "aol.com"})) == fp(closure({"aol.com", "yahoo.com", "gmail.com"}))
    assert fp(defaulted(Tier.GOLD)) == fp(defaulted(Tier.GOLD))


def test_a_setting_in_a_module_a_helper_module_imports_is_followed(tmp_path: Path, monkeypatch) -> None:
    """`import scoring` in the play, `import settings` in scoring.py: an edit of settings.py
    kept the old cells (only scoring.py's own text was taken)."""
    import importlib
    import sys

    from deepline_cli.runtime.map.columns import code_fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fp_scoring.py").write_text("import fp_settings\n\ndef score(row):\n    return fp_settings.MIN\n")

    def fingerprint(setting: int) -> str:
        (tmp_path / "fp_settings.py").write_text(f"MIN = {setting}\n")
        for name in ("fp_scoring", "fp_settings"):
            sys.modules.pop(name, None)
        scoring = importlib.import_module("fp_scoring")

        def resolve(row: dict[str, Any]) -> Any:
            return scoring.score(row)

        return code_fingerprint(resolve)

    assert fingerprint(50) != fingerprint(80)


WHERE_PLAY = """\
import functools
from dataclasses import dataclass

from deepline_cli import play


def traced(fn):  # a logging decorator: `fn.__name__` is an attribute, not where the play sits
    @functools.wraps(fn)
    def wrapper(row):
        print(f"calling {fn.__name__}")
        return fn(row)
    return wrapper


@traced
def company(row):
    return row["domain"].split(".")[0].title()


@dataclass(frozen=True)
class Config:
    provider: str


def make(cfg, free):
    def resolve(row):
        return f"{cfg.provider}:{row['domain'] in free}"
    return resolve


@play("where")
async def where(ctx, input):
    rows = await ctx.map("m", [{"domain": "acme.com"}, {"domain": "gmail.com"}], key="domain", columns={
        "company": company,
        "cfg": make(Config("hunter"), {"gmail.com", "yahoo.com", "hotmail.com", "aol.com"}),
        "titles": (lambda titles: lambda row: len(titles))(list({"ceo", "cto", "cfo", "coo", "vp"})),
    })
    return [dict(r) for r in rows]
"""


def test_a_fingerprint_is_the_same_from_another_folder_under_a_worker_and_any_hash_seed(
    deepline_process: Run, tmp_path: Path
) -> None:
    """The play's module is named after where its file sits: a resolver reading `fn.__name__`
    and an object of the play's own class in a closure made the same unchanged play
    recompute in a colleague's checkout, in CI, and under `deepline worker` (which runs its
    snapshot), and again back home. Sets and a list made from one: not the hash seed's."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "play.py").write_text(WHERE_PLAY)
    first = finished(deepline_process("run", "a/play.py", "--json", PYTHONHASHSEED="1"))
    assert first["stats"]["rows"]["reused"] == 0
    for folder, seed in (("a", "2"), ("b", "3"), ("a", "4")):
        again = finished(deepline_process("run", f"{folder}/play.py", "--json", PYTHONHASHSEED=seed))
        assert again["stats"]["rows"]["reused"] == 2, (folder, seed, again["stats"]["rows"])
    assert deepline_process("run", "a/play.py", "--enqueue", "--run-id", "queued", PYTHONHASHSEED="5").code == 0
    assert deepline_process("worker", "--once", PYTHONHASHSEED="6").code == 0
    shown = json.loads(deepline_process("runs", "show", "queued", "--json").stdout)
    assert (shown["status"], shown["stats"]["rows"]["reused"]) == ("completed", 2), shown["stats"]["rows"]


ROW_STEPS = """
from deepline_cli import play

def label(row):
    return "v1:" + row["name"]

async def tagged(row, rc):
    return await rc.step("label", lambda: label(row))

async def upper(row, rc):
    return await rc.step("label", lambda: row["name"].upper())  # the same id in another column

@play("rowsteps")
async def rowsteps(ctx, input):
    rows = await ctx.map("m", [{"id": "1", "name": "ada"}, {"id": "2", "name": "alan"}], key="id",
                         columns={"tag": tagged, "up": upper})
    if ctx.run.attempt == 1:
        raise RuntimeError("after the map")
    return {r["id"]: [r["tag"], r["up"]] for r in rows}
"""


def test_an_rc_step_is_made_again_where_its_cell_is_computed_anew_within_a_run(write_play, store_path) -> None:
    """An `rc.step` is the cell's: edited between an interrupted attempt and its resume, the
    resume gave back the first attempt's value (`v1:alan`, not `v2:alan`); and two columns of
    a row asking the same step id were given one value (`up` held `v1:ada`)."""
    play = write_play(ROW_STEPS)
    assert run_play(play, store_path, run_id="rs").status == "failed"
    play.write_text(play.read_text().replace('"v1:"', '"v2:"'))
    again = resume_run("rs", store_path)
    assert again.status == "completed", again.error
    assert again.output == {"1": ["v2:ada", "ADA"], "2": ["v2:alan", "ALAN"]}, again.output


def test_a_column_whose_code_changed_is_said_once_as_its_cells_are_computed_again(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """An edited play run again (or resumed) computed cells again without a word: which
    column, and why its rows are done again, were for the user to guess."""
    source = ROW_STEPS.replace('    if ctx.run.attempt == 1:\n        raise RuntimeError("after the map")\n', "")
    play = write_play(source)
    assert deepline("run", str(play), "--quiet").code == 0
    play.write_text(source.replace('"v1:"', '"v2:"'))
    again = deepline("run", str(play), "--json")
    assert again.code == 0, again.stderr
    warned = [e["message"] for e in again.json_lines() if e.get("level") == "warning"]
    assert warned == [
        "Map 'm': column 'tag' changed since its cells were computed (its code, what it reads, or a tool's "
        "version): computing them again; a tool call asked as before comes back from its receipt, one asked "
        "anew (a new version, another input), an rc.step, rc.fetch or force=True call is made again"
    ], warned
    assert again.json_lines()[-1]["output"] == {"1": ["v2:ada", "ADA"], "2": ["v2:alan", "ALAN"]}


LEGACY_STEP = """
from pathlib import Path
from deepline_cli import play

HERE = Path(__file__).parent

async def label(row, rc):
    def make():
        with open(HERE / "made.txt", "a") as made:
            made.write(row["id"] + "\\n")
        return "L" + row["id"]
    return await rc.step("label", make)

def after(row):
    if not (HERE / "fixed").exists():
        raise TypeError("a bug in the play")  # stops the map; the step's answer is recorded, the row not
    return 1

@play("legacy")
async def legacy(ctx, input):
    rows = await ctx.map("m", [{"id": "1"}], key="id", columns={"label": label, "after": after})
    return [r["label"] for r in rows]
"""


def test_a_run_begun_before_cells_had_their_own_steps_finds_its_steps_on_resume(
    write_play: Callable[..., Path], store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose first attempt keyed its `rc.step`s by the row (as deepline did before a
    cell's calls were its own) resumed after the upgrade: its steps come back, not made again."""
    from deepline_cli.runtime.map.row_context import RowContext

    play = write_play(LEGACY_STEP)
    with monkeypatch.context() as before:
        before.setattr(RowContext, "_made_for", lambda self: "")  # the row's key, as before
        assert run_play(play, store_path, run_id="lg").status == "failed"
    with sqlite3.connect(store_path) as conn:  # a run recorded then holds no cell_keys option
        conn.execute("UPDATE runs SET options = json_remove(options, '$.cell_keys') WHERE run_id = 'lg'")
    (play.parent / "fixed").touch()
    again = resume_run("lg", store_path)
    assert (again.status, again.output) == ("completed", ["L1"]), again.error
    assert (play.parent / "made.txt").read_text().split() == ["1"]


def test_functions_held_in_data_count_the_same_whatever_was_walked_first() -> None:
    """Each function in a tuple or set was walked after the ones before it, sharing what they
    had taken in: one calling another gave an empty part, so the order of a tuple (and of a
    set: its members' memory addresses) changed the fingerprint."""
    import functools

    from deepline_cli.runtime.map.columns import code_fingerprint as fp

    def finders() -> tuple[Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any]]:
        def apollo(row: dict[str, Any]) -> Any:
            return "apollo"

        def hunter(row: dict[str, Any]) -> Any:
            return apollo(row) or "hunter"  # calls the other

        return hunter, apollo

    def first(row: dict[str, Any], finders: Any) -> Any:
        return [f(row) for f in finders]

    hunter, apollo = finders()
    ordered = fp(functools.partial(first, finders=(hunter, apollo)))
    assert ordered == fp(functools.partial(first, finders=(apollo, hunter)))
    # a set of them iterates in their addresses' order: new functions each time, one fingerprint
    sets = {fp(functools.partial(first, finders=frozenset(finders()))) for _ in range(20)}
    assert len(sets) == 1, sets

    class Finder:
        def __call__(self, row: dict[str, Any]) -> Any:
            return "found"

    Finder.__module__ = "deepline_play_0123456789ab"  # the play file's module, named after where it sits
    moved = fp(Finder())
    Finder.__module__ = "deepline_play_ba9876543210"
    assert fp(Finder()) == moved


def test_data_nested_deeper_than_json_goes_or_holding_itself_has_a_fingerprint() -> None:
    """Lists read by their members: a list nested 5,000 deep raised RecursionError (and 300
    deep, JSON's own limit) before the map's first row; one that holds itself is no data."""
    from deepline_cli.runtime.map.columns import code_fingerprint as fp

    def closure(value: Any) -> Callable[[dict[str, Any]], Any]:
        def resolve(row: dict[str, Any]) -> Any:
            return value

        return resolve

    for depth in (300, 5000):
        deep: list[Any] = []
        inner = deep
        for _ in range(depth):
            inner.append([])
            inner = inner[0]
        assert len(fp(closure(deep))) == 64
    loop: list[Any] = ["a"]
    loop.append(loop)
    assert len(fp(closure(loop))) == 64


def test_a_helper_a_library_decorator_wraps_is_followed(tmp_path: Path) -> None:
    """`@functools.singledispatch` (or a retry decorator) on a helper the resolver calls: the
    library's wrapper function stood for it, and an edit of the helper kept the old cells."""
    import importlib.util

    from deepline_cli.runtime.map.columns import code_fingerprint

    source = (
        "import functools\n\n@functools.singledispatch\ndef size(x):\n    return 1\n\n"
        "def resolve(row):\n    return size(row)\n"
    )

    def fingerprint(name: str, text: str) -> str:
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return code_fingerprint(module.resolve)

    assert fingerprint("wrapped_a", source) != fingerprint("wrapped_b", source.replace("return 1", "return 2"))
