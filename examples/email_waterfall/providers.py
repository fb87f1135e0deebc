"""Four email providers and a validator, offline, on 127.0.0.1 (one server, one path each).

    python examples/email_waterfall/providers.py            # port 8787 (DEMO_PROVIDERS_PORT in .env)
    python examples/email_waterfall/providers.py --port 0 --latency-ms 0

They answer like the real ones, deterministically for the same person:
- Hunter (`GET /hunter/v2/email-finder`) finds about half; otherwise `"email": null`.
- Apollo (`POST /apollo/v1/people/match`) is down for a few people (503 every time: the
  waterfall moves on) and finds half of the rest.
- Dropcontact (`POST /dropcontact/v1/enrich`) answers 404 for people it does not know,
  a list of emails for the others.
- A pattern guesser (`GET /patterns/v1/guess`) always answers, with a confidence.
- ZeroBounce (`GET /zerobounce/v2/validate`) says valid, catch-all or invalid.

Each checks its API key (the demo keys in .env) and bills an idempotency key once;
`GET /_stats` tells what they received and billed.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

from deepline_cli.testing import FakeProvider, Request

KEYS = {
    "hunter": "demo-hunter-0b1c2d3e",
    "apollo": "demo-apollo-4f5a6b7c",
    "dropcontact": "demo-dropcontact-8d9e",
    "zerobounce": "demo-zerobounce-0f1a",
}
LATENCY_S = [0.04]
providers = FakeProvider("email providers")


def roll(*parts: str) -> int:
    """0..99, the same for the same person and provider."""
    text = "|".join(p.strip().lower() for p in parts)
    return int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) % 100


def refused(request: Request, provider: str) -> tuple[int, dict[str, str]] | None:
    given = {
        request.query.get("api_key", ""),
        request.headers.get("x-api-key", ""),
        request.headers.get("authorization", "").removeprefix("Bearer ").strip(),
    }
    return None if KEYS[provider] in given else (401, {"error": f"{provider}: invalid API key"})


def answer_after_latency() -> None:
    if LATENCY_S[0]:
        time.sleep(LATENCY_S[0])


def address(first: str, last: str, domain: str, style: str) -> str:
    first, last = first.strip().lower(), last.strip().lower().replace(" ", "")
    local = {"first": first, "first.last": f"{first}.{last}", "fl": f"{first[:1]}{last}"}[style]
    return f"{local}@{domain}"


@providers.route("GET", "/hunter/v2/email-finder")
def hunter(request: Request) -> Any:
    answer_after_latency()
    if denied := refused(request, "hunter"):
        return denied
    q = request.query
    score = roll("hunter", q["first_name"], q["last_name"], q["domain"])
    if score < 50:
        return {"data": {"email": None, "score": 0, "domain": q["domain"]}}
    return {"data": {"email": address(q["first_name"], q["last_name"], q["domain"], "first"), "score": score}}


@providers.route("POST", "/apollo/v1/people/match")
def apollo(request: Request) -> Any:
    answer_after_latency()
    if denied := refused(request, "apollo"):
        return denied
    body = request.json or {}
    roll_ = roll("apollo", body["first_name"], body["last_name"], body["domain"])
    if roll_ < 8:
        return 503, {"error": "service unavailable"}
    if roll_ < 54:
        return {"person": None}
    email = address(body["first_name"], body["last_name"], body["domain"], "first.last")
    return {"person": {"email": email, "title": "unknown", "email_status": "verified"}}


@providers.route("POST", "/dropcontact/v1/enrich")
def dropcontact(request: Request) -> Any:
    answer_after_latency()
    if denied := refused(request, "dropcontact"):
        return denied
    (person,) = (request.json or {})["data"]
    roll_ = roll("dropcontact", person["first_name"], person["last_name"], person["website"])
    if roll_ < 60:
        return 404, {"error": "no one known by that name"}
    emails = [{"email": address(person["first_name"], person["last_name"], person["website"], "fl"),
               "qualification": "nominative@pro"}]  # fmt: skip
    if roll_ > 85:
        emails.append({"email": address(person["first_name"], "", person["website"], "first"), "qualification": "pro"})
    return {"data": [{"email": emails, "civility": ""}], "success": True}


@providers.route("GET", "/patterns/v1/guess")
def patterns(request: Request) -> Any:
    answer_after_latency()
    q = request.query
    confidence = roll("pattern", q["first_name"], q["last_name"], q["domain"])
    return {"email": address(q["first_name"], q["last_name"], q["domain"], "first.last"), "confidence": confidence}


@providers.route("GET", "/zerobounce/v2/validate")
def zerobounce(request: Request) -> Any:
    answer_after_latency()
    if denied := refused(request, "zerobounce"):
        return denied
    roll_ = roll("zerobounce", request.query["email"])
    status = "valid" if roll_ < 80 else "catch-all" if roll_ < 90 else "invalid"
    return {"address": request.query["email"], "status": status, "sub_status": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description="Offline email providers for the waterfall example.")
    parser.add_argument("--port", type=int, default=8787, help="0: any free port")
    parser.add_argument("--latency-ms", type=float, default=40.0)
    args = parser.parse_args()
    LATENCY_S[0] = args.latency_ms / 1000
    providers.serve(args.port, ready=lambda port: print(f"listening on http://127.0.0.1:{port}", flush=True))


if __name__ == "__main__":
    main()
