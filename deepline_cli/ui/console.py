"""The human view on stderr: a Rich live view on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from deepline_cli.runtime.events import Event
from deepline_cli.ui.state import RunView

PLAIN_PROGRESS_EVERY_S = 5.0


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def tool_lines(tools: dict[str, dict[str, Any]], paced: dict[str, float]) -> list[str]:
    lines = []
    for tool_id, c in sorted(tools.items()):
        line = (f"{tool_id:<16} live {c.get('live', 0):,}  reused {c.get('reused', 0):,}"
                f"  failed {c.get('failed', 0):,}")  # fmt: skip
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
            self._live = Live(console=self.console, get_renderable=self.render,
                              refresh_per_second=4, transient=False)  # fmt: skip
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
        elif event.event == "run.finished":
            for line in tool_lines(s.tools, {}):
                self.console.print(f"tools  {line}")

    def render(self) -> Group:
        s = self.state
        header = Table.grid(expand=True)
        header.add_column()
        header.add_column(justify="right")
        header.add_row(
            Text.assemble(("deepline  ", "bold"), (s.play, "cyan"), f"  run {s.run_id}",
                          f"  attempt {s.attempt}"),
            _clock(s.elapsed),
        )  # fmt: skip
        parts: list[Any] = [header]
        for index, line in enumerate(tool_lines(s.tools, s.paced)):
            parts.append(Text(("tools  " if index == 0 else "       ") + line))
        return Group(*parts)
