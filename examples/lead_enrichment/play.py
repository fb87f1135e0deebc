"""Lead enrichment: company lookup, an email waterfall across two providers, validation.

    deepline run examples/lead_enrichment/play.py --csv examples/lead_enrichment/leads.csv
    deepline run examples/lead_enrichment/play.py --csv examples/lead_enrichment/leads.csv --limit 20
    deepline run examples/lead_enrichment/play.py --csv examples/lead_enrichment/leads.csv --set latency=0
    deepline export RUN_ID --out enriched.csv

The providers are offline stand-ins with realistic latency and failures:
- `demo.company` knows most domains (slow-ish, 1 credit);
- `demo.finder_a` finds an email for most people but is flaky (a transient 503 now and then);
- `demo.finder_b` is the fallback, used only when A fails transiently (2 credits);
- `demo.validate` checks the email found (0.5 credit), only for rows that have one.

The providers answer about as slowly as real ones (a run takes some 20 seconds), so there
is time to Ctrl-C it half way and `deepline resume RUN_ID`: finished rows are not redone and
no finished call is paid for again. `--set latency=0` makes them answer at once (`latency`
scales their delay; it is not part of any call's input, so it changes no receipt).
"""

from __future__ import annotations

import asyncio
import hashlib

from deepline_cli import Column, ProviderTransientError, ToolExecutionError, play, tool

LATENCY = [8.0]  # the providers' delay factor, set by the play's input (not part of any call)


async def _answer_in(seconds: float) -> None:
    await asyncio.sleep(seconds * LATENCY[0])


def _roll(*parts: str) -> int:
    """A stable pseudo-random number 0..99 for the same inputs (so reruns agree)."""
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:4], 16) % 100


@tool("demo.company", credits=1, concurrency=16)
async def company(input: dict) -> dict | None:
    await _answer_in(0.03)
    domain = input["domain"]
    if _roll("company", domain) < 5:
        return None  # unknown company: no result
    return {"domain": domain, "name": domain.split(".")[0].title(), "size": 10 + _roll("size", domain) * 40}


@tool("demo.finder_a", credits=1, rate_limit="200/s")
async def finder_a(input: dict, call) -> dict:
    await _answer_in(0.04)
    if _roll("a-flaky", input["first_name"], input["domain"]) < 12:
        raise ProviderTransientError("503 from demo.finder_a", category="upstream", status_code=503)
    first = input["first_name"].lower()
    return {"email": f"{first}@{input['domain']}", "source": "finder_a", "request": call.idempotency_key}


@tool("demo.finder_b", credits=2)
async def finder_b(input: dict) -> dict:
    await _answer_in(0.06)
    if _roll("b-miss", input["first_name"], input["domain"]) < 20:
        raise ToolExecutionError("404: no email known", category="validation", status_code=404)
    first, last = input["first_name"].lower(), input["last_name"].lower()
    return {"email": f"{first}.{last}@{input['domain']}", "source": "finder_b"}


@tool("demo.validate", credits=0.5)
def validate(input: dict) -> dict:
    score = _roll("valid", input["email"])
    return {"deliverable": score >= 15, "score": score}


async def find_email(row: dict, rc) -> dict:
    """The waterfall: provider A, then B only when A failed transiently."""
    person = {"first_name": row["first_name"], "last_name": row["last_name"], "domain": row["domain"]}
    try:
        return (await rc.tools.execute("email-a", "demo.finder_a", person)).output
    except ProviderTransientError:
        return (await rc.tools.execute("email-b", "demo.finder_b", person)).output


@play("lead-enrichment", description="Company lookup, email waterfall and validation for a CSV of leads")
async def lead_enrichment(ctx, input):
    LATENCY[0] = float(input.get("latency", LATENCY[0]))
    leads = ctx.csv(
        input["csv"],
        rename={
            "First Name": "first_name",
            "Last Name": "last_name",
            "Company": "company_name",
            "Domain": "domain",
        },
        required=["first_name", "domain"],
    )
    rows = await ctx.map(
        "leads",
        leads,
        key=["first_name", "last_name", "domain"],
        concurrency=10,
        columns={
            "company": lambda row, rc: rc.tools.execute("company", "demo.company", {"domain": row["domain"]}),
            "email": Column(find_email, run_if=lambda row: row["company"] is not None),
            "valid": Column(
                lambda row, rc: rc.tools.execute("validate", "demo.validate", {"email": row["email"]["email"]}),
                run_if=lambda row: row["email"] is not None,
            ),
        },
    )
    deliverable = sum(1 for row in rows if (row.get("valid") or {}).get("deliverable"))
    if input.get("out"):
        rows.to_csv(ctx.resolve_path(input["out"]))
    return {"rows": len(rows), "failed": rows.failed_count, "deliverable": deliverable}
