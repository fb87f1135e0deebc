"""Email waterfall: four providers asked in turn, then a validator, over a messy CRM export.

    python examples/email_waterfall/providers.py &      # the providers, offline (port 8787)
    deepline run examples/email_waterfall/play.py --csv examples/email_waterfall/leads.csv
    deepline run examples/email_waterfall/play.py --csv examples/email_waterfall/leads.csv   # again: pays nothing

Each lead is asked of Hunter, then Apollo, then Dropcontact (only with a last name), then a
pattern guesser (only a confident guess counts); the first that finds an email wins and the
rest are not called. A provider that is down (503 after its retries) or does not know the
person (404) passes the lead on. Found emails are validated. The export says which step
found each email (`email_step`); the live view and the verdict count hits per step.
"""

from __future__ import annotations

import re

from deepline_cli import Column, play, steps

MIN_CONFIDENCE = 50  # a guessed address below this is not worth validating


def domain_of(website: str) -> str:
    """`https://www.Acme.com/about` → `acme.com`."""
    host = re.sub(r"^[a-z]+://", "", website.strip().lower())
    return host.split("/")[0].removeprefix("www.")


def person(row: dict) -> dict:
    return {
        "first_name": row["first_name"].strip().title(),
        "last_name": row["last_name"].strip(),
        "domain": domain_of(row["domain"]),
    }


def lead_key(row: dict) -> list[str]:
    p = person(row)
    return [p["first_name"].lower(), p["last_name"].lower(), p["domain"]]


async def hunter(row, rc):
    result = await rc.tools.execute("hunter", "hunter.email_finder", person(row), description="work email (Hunter)")
    return result.get("email")


async def apollo(row, rc):
    result = await rc.tools.execute("apollo", "apollo.people_match", person(row), description="work email (Apollo)")
    return result.get("email")


async def dropcontact(row, rc):
    result = await rc.tools.execute("dropcontact", "dropcontact.enrich", person(row))
    emails = result.get("emails") or []
    return emails[0] if emails else None


async def pattern(row, rc):
    guess = await rc.tools.execute("pattern", "patterns.guess", person(row))
    return guess.get("email") if guess.get("confidence", 0) >= MIN_CONFIDENCE else None


def has_last_name(row: dict) -> bool:
    return bool(row["last_name"].strip())


EMAIL = (
    steps()
    .step("hunter", hunter)
    .step("apollo", apollo)
    .step("dropcontact", dropcontact, run_if=has_last_name)
    .step("pattern", pattern)
)


async def validate(row, rc):
    result = await rc.tools.execute("validate", "zerobounce.validate", {"email": row["email"]})
    return result.get("status")


@play("email-waterfall", description="Find and validate work emails, four providers in turn")
async def email_waterfall(ctx, input):
    leads = ctx.csv(
        input["csv"],
        columns={
            "first_name": ["First Name", "Firstname", "first"],
            "last_name": ["Last Name", "Surname"],
            "domain": ["Company Website", "Website", "Company Domain"],
        },
        required=["first_name", "domain"],
        description="leads from the CRM export",
    )
    rows = await ctx.map(
        "leads",
        leads,
        key=lead_key,
        columns={
            "email": Column(EMAIL, run_if=lambda row: bool(domain_of(row["domain"]))),
            "status": Column(validate, run_if=lambda row: row["email"] is not None),
        },
    )
    found = sum(1 for row in rows if row["email"])
    valid = sum(1 for row in rows if row["status"] == "valid")
    ctx.log(f"{found} of {len(rows)} leads have an email; {valid} of them are valid")
    if input.get("out"):
        rows.to_csv(ctx.resolve_path(input["out"]))
    return {"leads": len(rows), "found": found, "valid": valid, "failed": rows.failed_count}
