"""`deepline serve`: webhooks that queue runs (see server/webhooks.py for the protocol)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from deepline_cli.cli import stop_at_once
from deepline_cli.cli.common import StoreOption, at_least, cli_errors

if TYPE_CHECKING:
    import socket


@cli_errors
def serve(
    plays: Annotated[list[str], typer.Argument(metavar="PLAY_FILE...", help="Plays served at /hooks/{play name}.")],
    host: Annotated[str, typer.Option("--host", metavar="ADDRESS", help="The address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", metavar="PORT", parser=at_least(0, most=65535), help="The port to listen on.")
    ] = 8787,
    run_here: Annotated[
        bool, typer.Option("--run-here", help="Also run the queued runs in this process (else workers do).")
    ] = False,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", metavar="N", parser=at_least(1), help="Larger deliveries get 413.")
    ] = 1 << 20,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            metavar="SECONDS",
            parser=at_least(1, number=float),
            help="How far a delivery's timestamp may be from now.",
        ),
    ] = 300.0,
    store: StoreOption = None,
) -> None:
    """Receive webhooks: a signed POST /hooks/{play} queues a run of that play with the JSON
    body as its input and answers 202 {"run_id": ...} at once; a delivery sent again (the
    same webhook-id) answers the same run id and queues nothing. GET /runs/{run_id} gives a
    run's status and counts, GET /healthz answers {"ok": true}. Signatures: the Standard
    Webhooks scheme (webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256
    of "id.timestamp.body">) under the play's @play(webhook_secret="NAME") secret.

    \b
    Examples:
      deepline serve inbound.py --run-here
      deepline serve plays/*.py --host 0.0.0.0 --port 8080 --store postgresql://db/deepline
    """
    import uvicorn

    from deepline_cli.cli.common import fail
    from deepline_cli.runtime.run.play import load_play
    from deepline_cli.runtime.run.worker import Worker
    from deepline_cli.server.webhooks import create_app, hooks_for
    from deepline_cli.store import open_store

    hooks = hooks_for([load_play(path) for path in plays])
    open_store(store).close()  # a store it cannot open or use: refused before anything listens
    host = host.removeprefix("[").removesuffix("]")  # `[::1]`, as a URL writes it
    listening = _listen(host, port)  # before anything starts: a port in use is one sentence
    port = listening.getsockname()[1]  # --port 0: the one the system gave
    app = create_app(hooks, store, max_body_bytes=max_body_bytes, tolerance_s=tolerance)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    worker, runs_here = None, None
    if run_here:
        worker = Worker(store, concurrency=4, report=_say)

        def work(worker: Worker = worker) -> None:
            try:
                worker.run()
            finally:  # it stopped on its own (its store cannot be used): serve stops too
                server.should_exit = server.should_exit or worker.failure is not None

        runs_here = threading.Thread(target=work, daemon=True, name="deepline-serve-worker")
        runs_here.start()
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    _say(
        f"deepline serve: http://{shown}:{port}/hooks/{{{'|'.join(hooks)}}}"
        + (" (running them here)" if run_here else "")
    )
    if worker is not None:
        # uvicorn hands the Ctrl-C or SIGTERM that stopped it back to the process's handler,
        # which ended the process at once: the runs here had no time to record their calls.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    try:
        server.run(sockets=[listening])
    finally:
        if worker is not None and runs_here is not None:
            worker.drain()  # runs in progress end `interrupted`, queued again for the next worker
            # A second Ctrl-C while they stop: at once (their calls in flight are re-sent later).
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, stop_at_once)
            runs_here.join(timeout=30)
    if worker is not None and worker.failure is not None:
        raise fail(f"the runs here stopped: {worker.failure}", 1)


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound: an address in use or not this machine's is a usage error."""
    import errno
    import socket  # here, not on every command's way to its --help

    from deepline_cli.errors import UsageError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"Port {port} on {host} is in use (another process listens there); pick another with --port N."
            ) from None
        raise UsageError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    return sock


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
