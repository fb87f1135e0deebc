"""Hello, deepline: an offline play with two local tools.

    deepline run examples/hello/play.py
    deepline run examples/hello/play.py --set people='[{"name": "Ada Lovelace", "domain": "analytical.engine"}]'

Run it twice: the second run pays for nothing, every call comes back from a receipt.
"""

from __future__ import annotations

import asyncio
import hashlib

from deepline_cli import play, tool


@tool("hello.company", credits=1)
async def company(input: dict) -> dict:
    """A stand-in for a paid company-lookup provider."""
    await asyncio.sleep(0.05)  # the provider's latency
    domain = input["domain"]
    return {"domain": domain, "name": domain.split(".")[0].title(), "employees": len(domain) * 37}


@tool("hello.email", credits=2)
def email(input: dict, call) -> dict:
    """A sync tool that would pass `call.idempotency_key` on to its provider."""
    digest = hashlib.sha256(input["name"].encode()).hexdigest()[:6]
    first = input["name"].split()[0].lower()
    return {"email": f"{first}@{input['domain']}", "confidence": int(digest, 16) % 100}


@play("hello", description="Look up a few companies and guess an email for each person")
async def hello(ctx, input):
    people = input.get("people") or [
        {"name": "Ada Lovelace", "domain": "analytical.engine"},
        {"name": "Grace Hopper", "domain": "cobol.dev"},
        {"name": "Alan Turing", "domain": "bletchley.park"},
    ]
    ctx.log(f"looking up {len(people)} people")

    async def enrich(person: dict) -> dict:
        found = await ctx.tools.execute("company", "hello.company", {"domain": person["domain"]})
        guess = await ctx.tools.execute("email", "hello.email", {"name": person["name"], "domain": person["domain"]})
        return {**person, "company": found.output["name"], **guess.output}

    rows = await asyncio.gather(*(enrich(p) for p in people))
    for row in rows:
        ctx.log(f"{row['name']}: {row['email']} ({row['confidence']}%)")
    return {"people": rows}
