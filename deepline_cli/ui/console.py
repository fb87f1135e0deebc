"""The human view on stderr: a Rich live view on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from deepline_cli.runtime.events import Event
from deepline_cli.ui.state import MapView, RunView

PLAIN_PROGRESS_EVERY_S = 5.0


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA -"
    minutes, secs = divmod(int(seconds), 60)
    return f"ETA {minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"ETA {minutes}:{secs:02d}"


def map_counts(m: MapView) -> str:
    total = f"/{m.total:,}" if m.total else ""
    text = (
        f"{m.done + m.duplicate:,}{total}  ✓ {m.succeeded:,}  ✗ {m.failed:,}  dup {m.duplicate:,}  reused {m.reused:,}"
    )
    if m.seeded and not m.completed:
        text += f"  from earlier attempt {m.seeded:,}"
    return text


def barrier_line(m: MapView) -> str | None:
    parts = []
    if m.visibility:
        parts.append(f"visibility {m.visibility}")
    if m.finalization:
        parts.append(f"finalization {m.finalization}")
    return "  ".join(parts) or None


def tool_lines(tools: dict[str, dict[str, Any]], paced: dict[str, float]) -> list[str]:
    lines = []
    for tool_id, c in sorted(tools.items()):
        line = f"{tool_id:<16} live {c.get('live', 0):,}  reused {c.get('reused', 0):,}  failed {c.get('failed', 0):,}"
        if tool_id in paced:
            line += f"  paced {paced[tool_id]:g}/s"
        if c.get("credits"):
            line += f"  credits {c['credits']:,.6g}"
        lines.append(line)
    return lines


class ConsoleView:
    """Listens to runtime events and draws them for a person."""

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None) -> None:
        self._stream = stream or sys.stderr
        self.console = Console(file=self._stream, highlight=False, soft_wrap=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.state = RunView()
        self._live: Live | None = None
        self._last_plain = 0.0

    def __enter__(self) -> ConsoleView:
        if self.live_mode:
            self._live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def handle(self, event: Event) -> None:
        self.state.apply(event)
        name = event.event
        if name == "log":
            self._print_log(event)
        elif not self.live_mode:
            self._plain(event)

    def _print_log(self, event: Event) -> None:
        level = event.data.get("level", "info")
        text = Text(event.data.get("message", ""))
        if level != "info":
            text.stylize("yellow")
        if self.live_mode:
            self.console.print(text)
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
            self.console.print(Text(f"{stamp} ") + text)

    def _plain(self, event: Event) -> None:
        s = self.state
        if event.event == "run.started":
            self.console.print(f"deepline  {s.play}  run {s.run_id}  attempt {s.attempt}")
        elif event.event == "run.progress":
            now = time.monotonic()
            if now - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
                self._last_plain = now
                for line in tool_lines(s.tools, s.paced):
                    self.console.print(f"{_clock(s.elapsed)} tools {line}")
        elif event.event == "map.progress":
            now = time.monotonic()
            if now - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
                self._last_plain = now
                m = s.maps[event.data["map"]]
                self.console.print(
                    f"{_clock(s.elapsed)} {m.name}  {map_counts(m)}  {m.rows_per_s:,.0f} rows/s  {_eta(m.eta_s)}"
                )
        elif event.event.startswith("barrier."):
            m = s.maps[event.data["map"]]
            kind = event.event.split(".", 1)[1]
            self.console.print(
                f"{_clock(s.elapsed)} {m.name}  barrier {kind} "
                f"{m.visibility if kind == 'visibility' else m.finalization}"
            )
        elif event.event == "run.finished":
            for line in tool_lines(s.tools, {}):
                self.console.print(f"tools  {line}")

    def render(self) -> Group:
        s = self.state
        header = Table.grid(expand=True)
        header.add_column()
        header.add_column(justify="right")
        header.add_row(
            Text.assemble(("deepline  ", "bold"), (s.play, "cyan"), f"  run {s.run_id}", f"  attempt {s.attempt}"),
            _clock(s.elapsed),
        )
        parts: list[Any] = [header]
        for m in list(s.maps.values()):
            parts.extend(self._render_map(m))
        for index, line in enumerate(tool_lines(s.tools, s.paced)):
            parts.append(Text(("tools  " if index == 0 else "       ") + line))
        return Group(*parts)

    def _render_map(self, m: MapView) -> list[Any]:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(width=24)
        grid.add_column(no_wrap=True)
        total = m.total or 0
        done = m.done + m.duplicate
        bar = ProgressBar(total=float(total) if total else None, completed=float(done), width=24)
        if m.completed:
            bar = ProgressBar(total=1.0, completed=1.0, width=24)
        grid.add_row(Text(m.name, style="bold"), bar, Text(map_counts(m)))
        lines: list[Any] = [grid]
        if not m.completed:
            lines.append(Text(f"{' ' * len(m.name)}  {m.rows_per_s:,.0f} rows/s  {_eta(m.eta_s)}", style="dim"))
        barriers = barrier_line(m)
        if barriers:
            lines.append(Text(f"barriers  {barriers}"))
        return lines
