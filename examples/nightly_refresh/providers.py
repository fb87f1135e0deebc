"""A company-data provider, offline, on 127.0.0.1: `GET /v1/companies/enrich?domain=…`.

    python examples/nightly_refresh/providers.py            # port 8788 (COMPANY_API_PORT in .env)

It knows about three companies in four (404 for the others), answers with employees,
industry and a `revision` that grows with every billed answer (so a refreshed value is
told from a stored one), checks its API key, and bills an idempotency key once.
`GET /_stats` tells what it received and billed, per domain under `domains`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import threading
import time
from collections import Counter
from typing import Any

from deepline_cli.testing import FakeProvider, Request

API_KEY = "demo-company-data-7a8b9c"
LATENCY_S = [0.05]
provider = FakeProvider("company data", api_key=API_KEY)
revisions = itertools.count(1)
asked: Counter[str] = Counter()
lock = threading.Lock()


def roll(domain: str) -> int:
    return int(hashlib.sha256(domain.encode()).hexdigest()[:6], 16) % 100


@provider.route("GET", "/v1/companies/enrich")
def enrich(request: Request) -> Any:
    if LATENCY_S[0]:
        time.sleep(LATENCY_S[0])
    domain = request.query.get("domain", "").lower()
    with lock:
        asked[domain] += 1
        revision = next(revisions)
    score = roll(domain)
    if score < 25:
        return 404, {"error": f"no company known at {domain}"}
    industries = ["Software", "Manufacturing", "Healthcare", "Retail", "Logistics"]
    return {
        "company": {
            "domain": domain,
            "employees": 10 + score * 37,
            "industry": industries[score % len(industries)],
            "revision": revision,
        }
    }


@provider.route("GET", "/_domains")
def domains(request: Request) -> Any:
    with lock:
        return dict(asked)


def main() -> None:
    parser = argparse.ArgumentParser(description="An offline company-data provider for the refresh example.")
    parser.add_argument("--port", type=int, default=8788, help="0: any free port")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()
    LATENCY_S[0] = args.latency_ms / 1000
    provider.serve(args.port, ready=lambda port: print(f"listening on http://127.0.0.1:{port}", flush=True))


if __name__ == "__main__":
    main()
