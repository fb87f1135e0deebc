"""Nightly account refresh: keep every account's firmographics fresh, paying only for what
went stale.

    python examples/nightly_refresh/providers.py &      # the provider, offline (port 8788)
    deepline run examples/nightly_refresh/play.py --csv examples/nightly_refresh/accounts.csv --max-credits 100

Run it every night (cron, CI, `deepline worker`): a company found is refreshed once its
data is older than `refresh_hours` (24 by default), a company the provider did not know is
asked again sooner, after `recheck_missing_hours` (6): new companies appear in its data
more often than known ones change. Fresh rows are reused whole, nothing paid; a stale one
is asked again (a new paid call, the earlier answer kept as an older receipt generation).
`--max-credits` caps what one night may spend.
"""

from __future__ import annotations

from deepline_cli import Column, ToolExecutionError, play

HOUR = 3600.0


def domain_of(website: str) -> str:
    host = website.strip().lower().split("://")[-1]
    return host.split("/")[0].removeprefix("www.")


async def firmographics(row, rc):
    try:
        result = await rc.tools.execute(
            "enrich", "companies.enrich", {"domain": domain_of(row["domain"])}, description="company firmographics"
        )
    except ToolExecutionError as exc:
        if exc.status_code == 404:
            return None  # not known (yet): asked again after recheck_missing_hours
        raise
    return result.output["company"]


def segment(row) -> str | None:
    company = row["firmographics"]
    if company is None:
        return None
    employees = company["employees"]
    return "enterprise" if employees >= 2000 else "mid-market" if employees >= 200 else "smb"


@play("account-refresh", description="Refresh firmographics of every account; pay only for stale rows")
async def account_refresh(ctx, input):
    refresh = float(input.get("refresh_hours", 24)) * HOUR
    recheck_missing = float(input.get("recheck_missing_hours", 6)) * HOUR

    def time_to_live(previous):
        return refresh if previous is not None else recheck_missing

    accounts = ctx.csv(input["csv"], columns={"domain": ["Website", "Domain"]}, required=["domain"])
    rows = await ctx.map(
        "accounts",
        accounts,
        key=lambda row: domain_of(row["domain"]),
        columns={
            # It reads no field of the input: changing the time to live recomputes nothing.
            "firmographics": Column(firmographics, stale_after_seconds=time_to_live, depends_on=[]),
            "segment": Column(segment, depends_on=[]),
        },
    )
    known = sum(1 for row in rows if row["firmographics"])
    if input.get("out"):
        rows.to_csv(ctx.resolve_path(input["out"]))
    return {"accounts": len(rows), "known": known, "unknown": len(rows) - known, "failed": rows.failed_count}
