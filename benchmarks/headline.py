"""The headline benchmark: durable deepline against plain httpx, httpcore, raw sockets and DBOS.

The same work, measured several ways in one invocation, in two scenarios:

- single host: N rows (default 10,000) x 2 HTTP calls made one after the other (A: POST
  /v1/company {"domain"}; then B: POST /v1/email with the domain and A's answer's `key`),
  all to one provider;
- multi host, a waterfall over three providers on three ports: A on the first, B on the
  second, and for every third row (B's answer is then treated as "not found") C: POST
  /v1/fallback on the third. 2N + N/3 calls.

50 rows in flight, against the loopback provider (`tests/provider.py`, 20 ms latency), each
provider its own process so it does not share the client's GIL. Every request carries an
`Idempotency-Key`, as deepline's do.

1. deepline: a play (`ctx.map`, concurrency 50) with HTTP tools from `deepline.toml`, run by
   `Runner(RunOptions(store=...)).start(...)` on a fresh SQLite store; every call goes
   through a durable receipt. Checked: every call live, N succeeded rows.
2. plain asyncio + httpx, no durability, connections kept per origin:
   a. one `httpx.AsyncClient` with a pool of 50 connections (`httpx_pool`);
   b. single-connection clients handed out per request, up to 50 per origin
      (`httpx_clients`);
   c. (b) with one `ssl.SSLContext` shared by the clients (`httpx_clients_sslctx`; each
      client otherwise loads the CA bundle itself, ~18 ms of CPU apiece);
   "best httpx" is the fastest of them. For reference: httpx's engine without its client
   layer, `httpcore.AsyncHTTPConnection`s handed out per request, per origin (`httpcore`).
3. the floor: hand-written HTTP/1.1 over asyncio streams, keep-alive connections per origin
   (`raw`).
4. DBOS Transact on a SQLite system database (single host only): one child workflow per row
   with two steps (one httpx call each), enqueued by a parent workflow on a queue of
   concurrency 50 (polled every 0.1 s; DBOS's default of 1 s only adds waiting). Twice: as
   DBOS ships (`dbos`: SQLite's rollback journal) and with the file switched to WAL first
   (`dbos_wal`, the journal mode deepline's store uses); ratios use the faster.

The peers (httpx, httpcore, dbos) run under benchmarks/.venv-peers, made on first use (or
with `--setup`) from benchmarks/requirements.txt, which pins their versions; deepline and
the raw floor run under the current python.

Each part runs in its own process; the fast parts run `--repeat` times (default 3),
interleaved, so a noisy neighbour hits every part alike. Reported per part: the best run,
the median, CPU seconds of the best run, and the connections the providers accepted
during the best run (`samples_s` has every run; `load_avg_1m` the machine's load before
and after). One JSON line:

    python benchmarks/headline.py [--rows N] [--scenario single|multi|both] [--skip-dbos] [--setup]
    python benchmarks/headline.py --rows 1000 --scenario multi --profile-deepline /tmp/deepline.prof
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROVIDER = ROOT / "tests" / "provider.py"
PEERS_VENV = HERE / ".venv-peers"
REQUIREMENTS = HERE / "requirements.txt"
HOST = "127.0.0.1"

COMPANY, EMAIL, FALLBACK = "/v1/company", "/v1/email", "/v1/fallback"
HTTPX_PARTS = ("httpx_pool", "httpx_clients", "httpx_clients_sslctx")
DBOS_PARTS = ("dbos", "dbos_wal")
FAST_PARTS = ("raw", "httpcore", "httpx_clients", "httpx_clients_sslctx", "deepline")
PEER_PARTS = frozenset({"httpcore", *HTTPX_PARTS, *DBOS_PARTS})
SCENARIOS = {"single": 1, "multi": 3}  # scenario: providers

PLAY = textwrap.dedent(
    """
    from deepline_cli import play


    def checked(result, answer):
        if result.output["echo"] != answer:  # the same check the plain parts make
            raise ValueError(f"unexpected answer {result.output}")
        return result.output


    @play("headline")
    async def headline(ctx, input):
        waterfall = input["hosts"] > 1

        async def email(row, rc):
            answer = {"domain": row["domain"], "ref": row["company"]["key"]}
            found = checked(await rc.tools.execute("email", "bench.email", answer), answer)
            if waterfall and int(row["id"]) % 3 == 0:  # B's answer is "not found": fall back to C
                return checked(await rc.tools.execute("fallback", "bench.fallback", answer), answer)
            return found

        rows = await ctx.map(
            "rows",
            ctx.csv(input["csv"]),
            key="id",
            concurrency=input["in_flight"],
            columns={
                "company": lambda row, rc: rc.tools.execute(
                    "company", "bench.company", {"domain": row["domain"]}
                ),
                "email": email,
            },
        )
        return {"rows": len(rows), "failed": rows.failed_count}
    """
)


CONFIG = textwrap.dedent(
    """
    [tools."bench.company"]
    method = "POST"
    url = "{bases[0]}/v1/company"
    json = {{ domain = "{{domain}}" }}

    [tools."bench.email"]
    method = "POST"
    url = "{bases[1]}/v1/email"
    json = {{ domain = "{{domain}}", ref = "{{ref}}" }}

    [tools."bench.fallback"]
    method = "POST"
    url = "{bases[2]}/v1/fallback"
    json = {{ domain = "{{domain}}", ref = "{{ref}}" }}
    """
)


def domain_of(i: int) -> str:
    return f"company{i}.com"


def calls_for(rows: int, hosts: int) -> int:
    return 2 * rows + (len(range(0, rows, 3)) if hosts > 1 else 0)


# --- the shared shape of the plain parts ------------------------------------------------------

Send = Callable[[int, str, dict[str, Any], str], Awaitable[dict[str, Any]]]  # (host, path, payload, key)


async def drive(send: Send, rows: int, in_flight: int, tag: str, hosts: int) -> int:
    """`in_flight` workers, each taking the next row and making its calls in turn."""
    pending = iter(range(rows))
    done = 0

    async def call(host: int, path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        answer = await send(host, path, payload, key)
        if path != COMPANY and answer["echo"] != payload:
            raise AssertionError(f"{key}: unexpected answer {answer}")
        return answer

    async def worker() -> None:
        nonlocal done
        for i in pending:
            domain = domain_of(i)
            company = await call(0, COMPANY, {"domain": domain}, f"{tag}-a-{i}")
            lead = {"domain": domain, "ref": company["key"]}
            await call(1 % hosts, EMAIL, lead, f"{tag}-b-{i}")
            if hosts > 1 and i % 3 == 0:  # B's answer is "not found": fall back to C
                await call(2, FALLBACK, lead, f"{tag}-c-{i}")
            done += 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done


class HandOut:
    """Single-connection clients handed out one per request, kept per origin (host index)."""

    def __init__(self, make: Callable[[int], Any], size: int) -> None:
        self._make = make
        self._idle: dict[int, list[Any]] = {}
        self._all: list[Any] = []
        self._size = size
        self._available: dict[int, asyncio.Semaphore] = {}

    async def use(self, host: int, method: str, *args: Any, **kwargs: Any) -> Any:
        available = self._available.setdefault(host, asyncio.Semaphore(self._size))
        idle = self._idle.setdefault(host, [])
        async with available:
            client = idle.pop() if idle else self._new(host)
            try:
                return await getattr(client, method)(*args, **kwargs)
            finally:
                idle.append(client)

    def _new(self, host: int) -> Any:
        client = self._make(host)
        self._all.append(client)
        return client

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all))


# --- httpx -------------------------------------------------------------------------------------


async def httpx_part(name: str, ports: list[int], rows: int, in_flight: int) -> int:
    import ssl

    import httpx

    bases = [f"http://{HOST}:{port}" for port in ports]
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=30)
    if name == "httpx_pool":
        limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
        pool = httpx.AsyncClient(limits=limits, trust_env=False)

        async def post(host: int, url: str, **kwargs: Any) -> Any:
            return await pool.post(url, **kwargs)

        close = pool.aclose
    else:
        context = ssl.create_default_context() if name == "httpx_clients_sslctx" else True
        clients = HandOut(lambda _: httpx.AsyncClient(limits=one, trust_env=False, verify=context), in_flight)

        async def post(host: int, url: str, **kwargs: Any) -> Any:
            return await clients.use(host, "post", url, **kwargs)

        close = clients.aclose

    async def send(host: int, path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        response = await post(host, bases[host] + path, json=payload, headers={"Idempotency-Key": key})
        response.raise_for_status()
        return response.json()

    try:
        return await drive(send, rows, in_flight, name, len(ports))
    finally:
        await close()


async def httpcore_part(ports: list[int], rows: int, in_flight: int) -> int:
    """httpx's own engine without the client layer: `httpcore.AsyncHTTPConnection`s per origin."""
    import httpcore

    def connection(host: int) -> Any:
        return httpcore.AsyncHTTPConnection(httpcore.Origin(b"http", HOST.encode(), ports[host]), keepalive_expiry=30)

    slots = HandOut(connection, in_flight)

    async def send(host: int, path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        headers = [
            (b"Host", f"{HOST}:{ports[host]}".encode()),
            (b"Content-Type", b"application/json"),
            (b"Content-Length", str(len(body)).encode()),
            (b"Idempotency-Key", key.encode()),
        ]
        url = httpcore.URL(scheme=b"http", host=HOST.encode(), port=ports[host], target=path.encode())
        response = await slots.use(host, "request", b"POST", url, headers=headers, content=body)
        if response.status != 200:
            raise AssertionError(f"{response.status} from {path}")
        return json.loads(response.content)

    try:
        return await drive(send, rows, in_flight, "httpcore", len(ports))
    finally:
        await slots.aclose()


# --- raw asyncio streams (the floor) -----------------------------------------------------------


async def raw_part(ports: list[int], rows: int, in_flight: int) -> int:
    idle: list[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = [[] for _ in ports]
    opened: list[asyncio.StreamWriter] = []
    heads = [f"Host: {HOST}:{port}\r\nContent-Type: application/json\r\nAccept: */*\r\n" for port in ports]

    async def connection(host: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if idle[host]:
            return idle[host].pop()
        reader, writer = await asyncio.open_connection(HOST, ports[host])
        opened.append(writer)
        return reader, writer

    async def send(host: int, path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        reader, writer = await connection(host)
        body = json.dumps(payload).encode()
        request = f"POST {path} HTTP/1.1\r\n{heads[host]}Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(request.encode() + body)
        await writer.drain()
        status = int((await reader.readline()).split(b" ", 2)[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        idle[host].append((reader, writer))
        if status != 200:
            raise AssertionError(f"{status} from {path}: {data[:200]!r}")
        return json.loads(data)

    try:
        return await drive(send, rows, in_flight, "raw", len(ports))
    finally:
        for writer in opened:
            writer.close()


# --- deepline ----------------------------------------------------------------------------------


def deepline_part(ports: list[int], rows: int, in_flight: int, profile: str | None) -> dict[str, Any]:
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner

    bases = [f"http://{HOST}:{ports[i % len(ports)]}" for i in range(3)]  # A, B, C
    with tempfile.TemporaryDirectory(prefix="deepline-headline-") as tmp:
        root = Path(tmp)
        play = root / "headline_play.py"
        play.write_text(PLAY)
        (root / "deepline.toml").write_text(CONFIG.format(bases=bases))
        csv_path = root / "rows.csv"
        csv_path.write_text("id,domain\n" + "".join(f"{i},{domain_of(i)}\n" for i in range(rows)))
        runner = Runner(RunOptions(store=str(root / "store.db")), EventBus())
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        start, cpu = time.perf_counter(), time.process_time()
        play_input = {"csv": str(csv_path), "in_flight": in_flight, "hosts": len(ports)}
        result = runner.start(str(play), play_input, cwd=tmp)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        runner.close()
    if result.status != "completed":
        raise AssertionError(f"deepline run {result.status}: {result.error}")
    stats = result.stats
    live = sum(t["live"] for t in stats["tools"].values())
    succeeded = stats["rows"]["succeeded"]
    if live != calls_for(rows, len(ports)) or succeeded != rows:
        raise AssertionError(f"expected {calls_for(rows, len(ports))} live calls and {rows} rows: {stats}")
    return {"seconds": seconds, "cpu_s": cpu, "rows": succeeded, "calls": live}


# --- DBOS (runs under benchmarks/.venv-peers) --------------------------------------------------


def dbos_part(port: int, rows: int, in_flight: int, poll_s: float, wal: bool) -> dict[str, Any]:
    import logging
    import sqlite3
    import ssl
    import threading

    import httpx
    from dbos import DBOS

    base = f"http://{HOST}:{port}"
    context = ssl.create_default_context()
    local = threading.local()
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=30)

    def client() -> httpx.Client:
        # One keep-alive client per DBOS executor thread.
        if not hasattr(local, "client"):
            local.client = httpx.Client(limits=one, trust_env=False, verify=context)
        return local.client

    with tempfile.TemporaryDirectory(prefix="dbos-headline-") as tmp:
        if wal:
            # WAL is a property of the file: DBOS's own connections then use it too.
            sqlite3.connect(f"{tmp}/dbos.sqlite").execute("PRAGMA journal_mode=WAL").fetchall()
        DBOS(
            config={
                "name": "headline",
                "system_database_url": f"sqlite:///{tmp}/dbos.sqlite",
                "log_level": "WARNING",
            }
        )

        @DBOS.step()
        def call(path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
            response = client().post(base + path, json=payload, headers={"Idempotency-Key": key})
            response.raise_for_status()
            return response.json()

        @DBOS.workflow()
        def row_workflow(i: int) -> bool:
            domain = domain_of(i)
            company = call(COMPANY, {"domain": domain}, f"dbos-a-{i}")
            email = call(EMAIL, {"domain": domain, "ref": company["key"]}, f"dbos-b-{i}")
            return email["echo"] == {"domain": domain, "ref": company["key"]}

        @DBOS.workflow()
        def parent(n: int) -> int:
            handles = [queue.enqueue(row_workflow, i) for i in range(n)]
            return sum(1 for handle in handles if handle.get_result())

        DBOS.launch()
        logging.getLogger("dbos").setLevel(logging.WARNING)
        queue = DBOS.register_queue("rows", global_concurrency=in_flight, polling_interval_sec=poll_s)
        start, cpu = time.perf_counter(), time.process_time()
        ok = parent(rows)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        from importlib.metadata import version as package_version

        version = package_version("dbos")
        DBOS.destroy()
    if ok != rows:
        raise AssertionError(f"DBOS: {ok} of {rows} rows succeeded")
    return {"seconds": seconds, "cpu_s": cpu, "rows": ok, "calls": 2 * ok, "version": version}


def peers_python(setup: bool) -> Path:
    """The python of benchmarks/.venv-peers, created from requirements.txt if needed."""
    python = PEERS_VENV / "bin" / "python"
    if setup or not python.exists():
        print("# creating benchmarks/.venv-peers from requirements.txt (once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return python


# --- orchestration -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_provider(latency_ms: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(PROVIDER), "--port", str(port), "--latency-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the loopback provider did not start on port {port}") from None
            time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def accepted(port: int) -> int:
    """Connections the provider on `port` has accepted so far (this query's own included)."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/_stats", timeout=10) as answer:
        return int(json.load(answer)["connections"])


def run_part(python: Path | str, part: str, args: argparse.Namespace, ports: list[int]) -> dict[str, Any]:
    cmd = [str(python), __file__, "--part", part, "--ports", ",".join(map(str, ports))]
    cmd += ["--rows", str(args.rows), "--in-flight", str(args.in_flight), "--dbos-poll-s", str(args.dbos_poll_s)]
    if part == "deepline" and args.profile_deepline:
        cmd += ["--profile-deepline", args.profile_deepline]
    print(f"# {part} on {len(ports)} host(s)", file=sys.stderr, flush=True)
    before = [accepted(port) for port in ports]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{part} failed (exit {out.returncode}): {tail}")
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    # Each /_stats query is a connection of its own: the one before this part is not the part's.
    report["connections"] = [accepted(port) - b - 1 for port, b in zip(ports, before, strict=True)]
    return report


def child(args: argparse.Namespace) -> None:
    ports = [int(p) for p in args.ports.split(",")]
    if args.part == "deepline":
        report = deepline_part(ports, args.rows, args.in_flight, args.profile_deepline)
    elif args.part in DBOS_PARTS:
        report = dbos_part(ports[0], args.rows, args.in_flight, args.dbos_poll_s, wal=args.part == "dbos_wal")
    else:
        start, cpu = time.perf_counter(), time.process_time()
        if args.part == "raw":
            done = asyncio.run(raw_part(ports, args.rows, args.in_flight))
        elif args.part == "httpcore":
            done = asyncio.run(httpcore_part(ports, args.rows, args.in_flight))
        else:
            done = asyncio.run(httpx_part(args.part, ports, args.rows, args.in_flight))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        report = {"seconds": seconds, "cpu_s": cpu, "rows": done, "calls": calls_for(done, len(ports))}
        if done != args.rows:
            raise AssertionError(f"{args.part}: {done} of {args.rows} rows")
    print(json.dumps(report))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def measure(scenario: str, args: argparse.Namespace, peers: Path) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Every run of every part on this scenario's providers, and what failed of DBOS."""
    providers = [start_provider(args.latency_ms) for _ in range(SCENARIOS[scenario])]
    ports = [port for _, port in providers]
    samples: dict[str, list[dict[str, Any]]] = {part: [] for part in ("httpx_pool", *FAST_PARTS)}
    errors = []

    def python(part: str) -> Path | str:
        return peers if part in PEER_PARTS else sys.executable

    try:
        samples["httpx_pool"].append(run_part(python("httpx_pool"), "httpx_pool", args, ports))  # slow: once
        for _ in range(args.repeat):
            for part in FAST_PARTS:
                samples[part].append(run_part(python(part), part, args, ports))
        if scenario == "single" and not args.skip_dbos:
            for part in DBOS_PARTS:  # slow: once each
                try:
                    samples[part] = [run_part(peers, part, args, ports)]
                except RuntimeError as exc:
                    errors.append(str(exc))
    finally:
        for process, _ in providers:
            stop(process)
    return samples, errors


def summary(samples: dict[str, list[dict[str, Any]]], rows: int, hosts: int) -> dict[str, Any]:
    fastest = {part: min(runs, key=lambda r: r["seconds"]) for part, runs in samples.items() if runs}
    best = {part: run["seconds"] for part, run in fastest.items()}
    median = {part: statistics.median(r["seconds"] for r in runs) for part, runs in samples.items() if runs}
    best_httpx = min(HTTPX_PARTS, key=lambda p: best[p])
    median_httpx = min(HTTPX_PARTS, key=lambda p: median[p])
    dbos = min((best[p] for p in DBOS_PARTS if p in best), default=None)  # the faster: WAL, usually
    return {
        "hosts": hosts,
        "calls": calls_for(rows, hosts),
        "best_s": {part: round(s, 3) for part, s in best.items()},
        "median_s": {part: round(s, 3) for part, s in median.items()},
        "best_httpx": best_httpx,
        "ratios_best": {
            "deepline/best_httpx": ratio(best["deepline"], best[best_httpx]),
            "deepline/raw": ratio(best["deepline"], best["raw"]),
            "deepline/httpcore": ratio(best["deepline"], best["httpcore"]),
            "best_httpx/raw": ratio(best[best_httpx], best["raw"]),
            "dbos/deepline": ratio(dbos, best["deepline"]),
        },
        "ratios_median": {
            "deepline/best_httpx": ratio(median["deepline"], median[median_httpx]),
            "deepline/raw": ratio(median["deepline"], median["raw"]),
        },
        "deepline_rows_per_s": round(rows / best["deepline"]),
        "connections": {part: run["connections"] for part, run in fastest.items()},
        "cpu_s": {part: round(run["cpu_s"], 2) for part, run in fastest.items()},
        "samples_s": {part: [round(r["seconds"], 3) for r in runs] for part, runs in samples.items()},
        **({"dbos_version": fastest["dbos"].get("version")} if "dbos" in fastest else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=50, help="rows in flight (default 50)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="provider latency (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each fast part (default 3)")
    parser.add_argument("--scenario", choices=("single", "multi", "both"), default="both")
    parser.add_argument("--skip-dbos", action="store_true", help="leave DBOS out")
    parser.add_argument("--setup", action="store_true", help="(re)create benchmarks/.venv-peers first")
    parser.add_argument(
        "--dbos-poll-s", type=float, default=0.1, help="DBOS queue polling interval (default 0.1; DBOS: 1.0)"
    )
    parser.add_argument("--profile-deepline", metavar="FILE", help="cProfile the deepline runs into FILE")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        child(args)
        return

    load_before = os.getloadavg()[0]
    peers = peers_python(args.setup)
    report: dict[str, Any] = {
        "benchmark": "headline",
        "rows": args.rows,
        "in_flight": args.in_flight,
        "latency_ms": args.latency_ms,
        "repeat": args.repeat,
        "dbos_poll_s": None if args.skip_dbos else args.dbos_poll_s,
    }
    for scenario, hosts in SCENARIOS.items():
        if args.scenario in (scenario, "both"):
            samples, errors = measure(scenario, args, peers)
            report[f"{scenario}_host"] = summary(samples, args.rows, hosts)
            if errors:
                report["dbos_error"] = "; ".join(errors)
    # Other processes on a small machine slow every part; the load says how quiet it was.
    report["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
