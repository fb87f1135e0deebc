"""`deepline serve`: webhooks that queue runs, exactly once per delivery.

    POST /hooks/{play}   a signed delivery ─► checked ─► a queued run ─► 202 {"run_id": …}
    GET  /runs/{run_id}  the status and counts of a run a delivery queued
    GET  /healthz        for load balancers

Signatures follow the Standard Webhooks scheme (standardwebhooks.com): the sender signs
`{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 under the play's secret and
sends `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature: v1,<base64>`
(several space-separated signatures are accepted, for secret rotation). A secret written
`whsec_<base64>` is base64-decoded; any other is used as its UTF-8 bytes. A delivery older
or newer than the tolerance is refused (a replay). The run id is derived from the play and
the delivery id, so a delivery sent again returns the same run id and queues nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from deepline_cli import _json
from deepline_cli.errors import DeeplineError, InputError, UsageError
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.runtime.run.triggers import delivery_run_ids, is_delivery_run
from deepline_cli.store import open_store

MAX_BODY_BYTES = 1 << 20
TOLERANCE_S = 300.0


@dataclass
class Hook:
    """A play served at /hooks/{name}, with the secret its deliveries are signed with."""

    play: PlayDef
    secret: bytes


def hooks_for(plays: Sequence[PlayDef]) -> dict[str, Hook]:
    """Every play must declare its `webhook_secret`, and the secret must be set."""
    hooks: dict[str, Hook] = {}
    for play in plays:
        if play.webhook_secret is None:
            raise UsageError(
                f'Play {play.name!r} declares no webhook_secret; add @play(..., webhook_secret="HOOK_SECRET") '
                "so deliveries can be checked."
            )
        secrets = Secrets(_folder(play))
        value = secrets.lookup(play.webhook_secret)
        if not value:
            raise UsageError(
                f"Play {play.name!r} needs the secret {play.webhook_secret}, which is not set; "
                f"export it or add it to {secrets.env_file}."
            )
        if play.name in hooks:
            raise UsageError(f"Two plays are named {play.name!r}; each webhook needs its own name.")
        hooks[play.name] = Hook(play, _secret_bytes(value))
    return hooks


def sign(secret: bytes, delivery_id: str, timestamp: str, body: bytes) -> str:
    """The `v1,<base64>` signature of a delivery (what a sender computes)."""
    mac = hmac.new(secret, f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(
    hooks: dict[str, Hook],
    store_url: str | None,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    tolerance_s: float = TOLERANCE_S,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The ASGI app (Starlette); `deepline serve` runs it on uvicorn."""

    async def hook(request: Request) -> JSONResponse:
        try:
            found = hooks.get(request.path_params["play"])
            if found is None:
                raise Refused(404, f"No play {request.path_params['play']!r} is served here.")
            delivery_id, body = await _checked(request, found, max_body_bytes, tolerance_s, clock)
            input = _input(body)
            run_ids = delivery_run_ids(found.play.name, delivery_id)
            run_id, queued = await run_in_threadpool(_enqueue, store_url, found.play, input, run_ids, delivery_id)
        except Refused as refused:
            return JSONResponse({"error": str(refused)}, status_code=refused.status)
        except InputError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        except DeeplineError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"run_id": run_id, "queued": queued}, status_code=202)

    async def run_status(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        # Only a run a delivery to one of its hooks queued (its id comes from the delivery's):
        # not any run of the store, whose output a guessed id (`nightly-2026-12-05`) would give.
        served = [name for name in hooks if is_delivery_run(run_id, name)]
        try:
            shown = await run_in_threadpool(_get_run, store_url, run_id) if served else None
        except DeeplineError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        if shown is None or shown.run.play not in served:
            return JSONResponse({"error": f"No run {run_id!r} of the plays served here."}, status_code=404)
        record, stats = shown.run, shown.run.stats or {}
        return JSONResponse(
            {
                "run_id": record.run_id, "play": record.play, "status": record.status, "attempt": record.attempt,
                "stale": shown.stale, "trigger": record.options.get("trigger"), "rows": stats.get("rows") or {},
                "credits": stats.get("credits"), "output": record.output, "error": record.error,
            }
        )  # fmt: skip

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/hooks/{play}", hook, methods=["POST"]),
            Route("/runs/{run_id}", run_status, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


async def _checked(
    request: Request, hook: Hook, max_body_bytes: int, tolerance_s: float, clock: Callable[[], float]
) -> tuple[str, bytes]:
    """The delivery id and body of a delivery that passes every check, else Refused."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise Refused(415, f"The body must be JSON (Content-Type: application/json), not {kind or 'none'!r}.")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise Refused(413, f"The body is over {max_body_bytes:,} bytes.")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise Refused(413, f"The body is over {max_body_bytes:,} bytes.")
    except ClientDisconnect:  # the sender went away mid-body: answered (to no one), not a traceback
        raise Refused(400, "The sender closed the connection before the body was whole.") from None
    delivery_id = request.headers.get("webhook-id", "")
    timestamp = request.headers.get("webhook-timestamp", "")
    signatures = request.headers.get("webhook-signature", "")
    if not delivery_id or not timestamp or not signatures:
        raise Refused(400, "A delivery needs the headers webhook-id, webhook-timestamp and webhook-signature.")
    if not timestamp.isdigit() or abs(clock() - int(timestamp)) > tolerance_s:
        raise Refused(401, f"The delivery's timestamp is not within {tolerance_s:g}s of now (a replay?).")
    expected = sign(hook.secret, delivery_id, timestamp, bytes(body))
    if not any(hmac.compare_digest(expected, given) for given in signatures.split()):
        raise Refused(401, "The delivery's signature does not match the play's webhook secret.")
    return delivery_id, bytes(body)


def _input(body: bytes) -> Any:
    try:
        value = _json.loads(body)
    except ValueError:
        raise Refused(400, "The body is not valid JSON.") from None
    if not isinstance(value, dict):
        raise Refused(422, "The body must be a JSON object: the play's input.")
    return value


def _enqueue(
    store_url: str | None, play: PlayDef, input: Any, run_ids: list[str], delivery_id: str
) -> tuple[str, bool]:
    """The delivery's run, and whether this queued it: a retry of a delivery an earlier
    deepline queued for this play under another id (`delivery_run_ids`) is that run."""
    runner = Runner(RunOptions(store=store_url), EventBus([]))
    try:
        run_id, *before = run_ids
        for earlier in before:  # another play's now, perhaps (a name cut alike): only this play's
            record = runner.store.runs.get_run(earlier)
            if record is not None and record.play == play.name:
                return earlier, False
        return run_id, runner.enqueue_new(
            play, input, run_id, f"webhook {delivery_id[:80]}", subject="The delivery's body"
        )
    finally:
        runner.close()


def _get_run(store_url: str | None, run_id: str) -> Any:
    """The run as `runs show` reads it: its figures from the store's ledger (a run still going
    has written none of its own yet), and whether no live process holds it."""
    from deepline_cli.ui.run_show import read_shown

    store = open_store(store_url)
    try:
        record = store.runs.get_run(run_id)
        return None if record is None else read_shown(store, record)
    finally:
        store.close()


def _secret_bytes(value: str) -> bytes:
    if value.startswith("whsec_"):
        try:
            return base64.b64decode(value[len("whsec_") :], validate=True)
        except ValueError:
            raise UsageError("A webhook secret written whsec_… must be base64 after the prefix.") from None
    return value.encode()


def _folder(play: PlayDef) -> Path:
    return Path(play.file).parent
