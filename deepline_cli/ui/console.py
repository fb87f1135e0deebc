"""The human view on stderr: a Rich live view on a terminal, plain lines otherwise.

    deepline  lead-enrichment  run r-8f2c  attempt 2                credits 714  00:42
    leads  ━━━━━━━━━━━━━━━━╸━━━━━━  214/302 71%  ✓ 200  ✗ 3  dup 11  reused 120
           148 rows/s  ETA 0:25
    tools  demo.finder_a  live 236  failed 2  fell back 37  retries 12 (429 9, 5xx 3)  credits 236

Every line is built from pieces in order of importance and fitted to the terminal's
width: on a narrow one the least important pieces go first, so failures and credits
stay in view and nothing wraps into the next line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from deepline_cli._format import format_credits, kept_said, retry_causes
from deepline_cli.runtime.calls.events import Event
from deepline_cli.ui.logs import shown_message
from deepline_cli.ui.state import MapView, RunView, step_hits
from deepline_cli.ui.streams import silence
from deepline_cli.ui.text import printable
from deepline_cli.ui.verdict import clock, verdict

PLAIN_PROGRESS_EVERY_S = 5.0  # a progress line per map in logs (no terminal); DEEPLINE_PROGRESS_EVERY_S sets it
BAR_WIDTH = 24
# text, importance (0: always shown; higher goes first when space is short), and optionally a
# shorter text that stands in before the piece goes (one step more important than it was)
Piece = tuple[str, int] | tuple[str, int, str]


def fit(pieces: list[Piece], width: int, sep: str = "  ") -> str:
    """Join the pieces that fit in `width`: the least important is shortened if it can be,
    else dropped, until the line fits."""
    kept = [p for p in pieces if p[0]]
    while kept and len(sep.join(p[0] for p in kept)) > width:
        least = max(range(len(kept)), key=lambda i: (kept[i][1], i))
        if kept[least][1] <= 1 and sep == "  ":  # the important pieces: closer together before any goes
            sep = " "
            kept = [(p[0].rstrip(), *p[1:]) for p in kept]
            continue
        if kept[least][1] == 0:
            break
        piece = kept[least]
        if len(piece) == 3:
            kept[least] = (piece[2], max(1, piece[1] - 1))
        else:
            kept.pop(least)
    line = sep.join(p[0] for p in kept)
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


NEXT = "  Next: "


def next_lines(line: str, width: int) -> list[str]:
    """A verdict line fitted to `width` without breaking a command. A `Next:` line too long
    for it goes under its label, a step to a line; the words before a step's command are
    wrapped, and the command (from `deepline` to the step's end) has a line of its own,
    whole even when wider than the terminal (which then wraps it; copying keeps it whole).
    Other lines are prose: returned as they are, for the terminal to wrap at words."""
    if len(line) <= width or not line.startswith(NEXT):
        return [line]
    pad = "    "
    lines = [NEXT.rstrip()]
    for step in line[len(NEXT) :].split(" · "):
        if len(pad) + len(step) <= width:
            lines.append(pad + step)
            continue
        at = step.find("deepline ")
        prose, command = (step[:at].rstrip(), step[at:]) if at >= 0 else (step, "")
        lines += [pad + words for words in _wrap_words(prose, max(10, width - len(pad)))]
        if command:
            lines.append(pad + command)
    return lines


def _wrap_words(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _eta(seconds: float | None) -> str:
    return "ETA -" if seconds is None else f"ETA {clock(seconds)}"


def map_pieces(m: MapView) -> list[Piece]:
    total = m.total or 0
    counted = f"{m.done:,}/{total:,}" if total else f"{m.done:,}"
    percent = f"{min(100, m.done * 100 // total)}%" if total and not m.completed else ""
    return [
        (m.name, 0),
        (counted, 0),
        (percent, 3),
        (f"✓ {m.succeeded:,}", 1),
        (f"✗ {m.failed:,}", 0),
        (f"dup {m.duplicate:,}", 4),
        # Rows an earlier attempt of this run finished, and rows taken whole from the sheet
        # as earlier runs left them: told apart, so a resume's counts explain themselves.
        (f"from earlier attempts {m.earlier:,}", 2, f"earlier {m.earlier:,}") if m.earlier else ("", 5),
        (f"reused from earlier runs {m.reused:,}", 4, f"reused {m.reused:,}"),
        (f"cells reused {m.reused_cells:,}" if m.reused_cells else "", 6),
    ]


def tool_pieces(
    tool_id: str, c: dict[str, Any], paced: dict[str, float], paused: dict[str, float], pad: int = 0
) -> list[Piece]:
    """One tool's line in pieces, its name padded to `pad` (the tools' lines line up)."""
    recovered = int(c.get("recovered", 0))
    final = int(c.get("failed", 0)) - recovered
    kept = int(c.get("kept", 0))
    missed = int(c.get("not_found", 0))
    retries = int(c.get("retries", 0))
    known = retry_causes(c.get("retry_reasons"), retries)
    reasons = ", ".join(f"{k} {v:,}" for k, v in known.items())
    retried: Piece = ("", 3)
    if retries:  # on a narrow line its causes go first, then it, before what explains the failures
        retried = (
            (f"retries {retries:,} ({reasons})", 3, f"retries {retries:,}") if reasons else (f"retries {retries:,}", 3)
        )
    state = ""
    if tool_id in paused:
        left = paused[tool_id]
        state = f"paused (429) {left:.1f}s" if left < 10 else f"paused (429) {left:.0f}s"
    elif tool_id in paced:
        state = f"paced {paced[tool_id]:g}/s"
    return [
        (tool_id.ljust(pad), 0),
        (f"live {c.get('live', 0):,}", 1),
        (f"reused {c.get('reused', 0):,}", 3),
        (f"not found {missed:,}" if missed else "", 2),  # "not found" answers (404) a row got past
        (f"failed {final:,}", 0),
        (f"fell back {recovered:,}" if recovered else "", 2),
        (f"({kept_said(kept)})", 2, f"({kept:,} earlier)") if kept else ("", 2),
        retried,
        (state, 1),
        (f"credits {format_credits(c['credits'])}" if c.get("credits") else "", 0),
    ]


NARROW = 60  # below this many columns the tool lines give up their "tools" label
PLAIN_WIDTH = 10_000  # the plain lines' width without a terminal: nothing is left out


def tool_lines(s: RunView, width: int, lead: str = "tools  ") -> list[str]:
    names = max((len(t) for t in s.tools), default=0)
    if width < NARROW:
        lead = ""  # the room goes to the counts: live, failed and credits stay whole
    every = [tool_pieces(tool_id, c, s.paced, s.paused, names) for tool_id, c in sorted(s.tools.items())]
    room = width - len(lead)
    # When what must stay does not fit one line two spaces apart, every line takes one: aligned.
    sep = " " if any(len("  ".join(p[0] for p in pieces if p[0] and p[1] <= 1)) > room for pieces in every) else "  "
    return [(lead if index == 0 else " " * len(lead)) + fit(pieces, room, sep) for index, pieces in enumerate(every)]


class ConsoleView:
    """Listens to runtime events and draws them for a person."""

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None) -> None:
        self._stream = stream or sys.stderr
        # When the reader goes away (`deepline run … 2>&1 | head`): stop drawing and call this
        # once, so the run is interrupted (resumable) rather than killed by a write.
        self.on_closed: Callable[[], None] | None = None
        self.closed = False
        # No markup: a map named "accounts [/tier]" is its name, not a closing tag that stops the view.
        self.console = Console(file=self._stream, highlight=False, soft_wrap=True, markup=False)
        # rich ends the process (SystemExit) when its reader goes away: mid-run, with calls out.
        self.console.on_broken_pipe = self._reader_gone  # type: ignore[method-assign]
        self.live_mode = self.console.is_terminal if live is None else live
        self.state = RunView()
        self._live: Live | None = None
        self._printed: dict[str, float] = {}  # plain mode: when each progress line was last printed
        self._shown: dict[str, str] = {}  # plain mode: each map's counts as last printed
        self._every_s = float(os.environ.get("DEEPLINE_PROGRESS_EVERY_S", PLAIN_PROGRESS_EVERY_S))

    def __enter__(self) -> ConsoleView:
        if self.live_mode:
            self._live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        finished = self.state.finished
        if finished is not None and not self.closed:
            said = verdict(finished["run_id"], finished["status"], _with_waiting(finished), finished.get("error"),
                           self.state.play)  # fmt: skip
            try:
                for line in said:
                    if not self.live_mode:
                        self.console.print(Text(line, style=_style(line)), soft_wrap=True)
                        continue
                    for part in next_lines(line, self.console.width):  # a command is never broken
                        self.console.print(Text(part, style=_style(line)), soft_wrap=part is not line)
            except OSError:  # its reader went away, a full disk
                self._reader_gone()

    def handle(self, event: Event) -> None:
        self.state.apply(event)
        if self.closed:
            return
        try:
            if event.event == "log":
                self._print_log(event)
            elif not self.live_mode:
                self._plain(event)
        except OSError:  # its reader went away (`2>&1 | head`), a full disk: the run stops, resumable
            self._reader_gone()

    def _reader_gone(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.console.quiet = True
        with contextlib.suppress(OSError, ValueError):
            silence(self._stream.fileno())
        if self.on_closed is not None:
            self.on_closed()

    def _print_log(self, event: Event) -> None:
        level = event.data.get("level", "info")
        message = shown_message(event.run_id, event.data.get("kind", "log"), event.data.get("message", ""))
        text = Text(printable(message, newlines=True))
        if level != "info":
            text.stylize("yellow")
        if not self.live_mode:
            text = Text(time.strftime("%H:%M:%S ", time.localtime(event.ts))) + text
        self.console.print(text, soft_wrap=not self.live_mode)  # a terminal wraps at words; a log keeps lines whole

    # --- plain lines (CI logs, pipes) -----------------------------------------------------------

    def _due(self, what: str) -> bool:
        now = time.monotonic()
        if now - self._printed.get(what, -self._every_s) < self._every_s:
            return False
        self._printed[what] = now
        return True

    def _plain(self, event: Event) -> None:
        # A log (CI, a file) has no width: each line whole. A terminal's lines are fitted to it.
        s, name = self.state, event.event
        width = max(self.console.width, 100) if self.console.is_terminal else PLAIN_WIDTH
        if name == "run.started":
            self.console.print(f"deepline  {s.play}  run {s.run_id}  attempt {s.attempt}")
        elif name == "run.progress" and s.tools and not event.data.get("final") and self._due("tools"):
            # (the final frame's counters are printed with run.finished, just after)
            for line in tool_lines(s, width - 6, lead="tools  "):
                self.console.print(f"{clock(s.elapsed)} {line}")
        elif name == "map.progress" and self._due(f"map:{event.data['map']}"):
            self._print_map(s.maps[event.data["map"]], width)
        elif name.startswith("barrier."):
            m = s.maps[event.data["map"]]
            words = m.visibility if name == "barrier.visibility" else m.finalization
            self.console.print(f"{clock(s.elapsed)} {m.name}  {words}")
        elif name == "run.finished":
            for m in s.maps.values():  # a map the run stopped between two progress lines: where it ended
                if not m.completed and self._shown.get(m.name) != fit(map_pieces(m), width):
                    self._print_map(m, width)
            for line in tool_lines(s, width):
                self.console.print(line)

    def _print_map(self, m: MapView, width: int) -> None:
        s = self.state
        rate = f"{m.rows_per_s:,.0f} rows/s  {_eta(m.eta_s)}"
        self.console.print(f"{clock(s.elapsed)} {fit([*map_pieces(m), (rate, 1)], width)}")
        self._shown[m.name] = fit(map_pieces(m), width)
        for column, order in m.waterfalls.items():
            hits = printable(step_hits(order, m.steps.get(column) or {}))  # names are the play's text
            self.console.print(f"{clock(s.elapsed)} {m.name}  {printable(column)}: {hits}")

    # --- the live view --------------------------------------------------------------------------

    def render(self) -> Group:
        s, width = self.state, self.console.width
        if not s.run_id:  # before the run is known (its play still loading, or failing to): nothing yet
            return Group()
        right = fit([(f"credits {format_credits(s.credits)}" if s.credits else "", 0), (clock(s.elapsed), 0)], width)
        left = fit([("deepline", 3), (s.play, 2), (f"run {s.run_id}", 0), (f"attempt {s.attempt}", 1)],
                   max(0, width - len(right) - 2))  # fmt: skip
        header = Text(left.ljust(max(0, width - len(right))) + right, no_wrap=True, overflow="ellipsis")
        header.stylize("bold", 0, len("deepline") if left.startswith("deepline") else 0)
        parts: list[Any] = [header]
        for m in list(s.maps.values()):
            parts.extend(self._render_map(m, width))
        parts.extend(Text(line, no_wrap=True, overflow="ellipsis") for line in tool_lines(s, width))
        return Group(*parts)

    def _render_map(self, m: MapView, width: int) -> list[Text]:
        pieces = map_pieces(m)[1:]
        # A long name is shortened (to half the line, or less) before the counts that must show
        # (done/total, ✗) would go.
        must = " ".join(p[0] for p in pieces if p[0] and p[1] == 0)
        room = max(8, min(width - len(must) - 2, max(16, width // 2)))
        name = m.name if len(m.name) <= room else m.name[: room - 1] + "…"
        counts = fit(pieces, width - len(name) - 2)  # beside the map's name
        room = width - len(name) - len(counts) - 4
        bar = _bar(m, min(BAR_WIDTH, room)) if room >= 8 else Text("")
        line = Text.assemble((name, "bold"), "  ", bar, "  " if bar.plain else "", counts)
        line.no_wrap, line.overflow = True, "ellipsis"
        lines = [line]
        indent = " " * min(len(name) + 2, 8)
        if not m.completed and self.state.finished is None:
            lines.append(Text(indent + fit([(f"{m.rows_per_s:,.0f} rows/s", 0), (_eta(m.eta_s), 0)], width), "dim"))
        for column, order in m.waterfalls.items():
            hits = printable(step_hits(order, m.steps.get(column) or {}))  # names are the play's text
            lines.append(
                Text(indent + fit([(f"{printable(column)}:", 0), (hits, 0)], width - len(indent)), no_wrap=True)
            )
        for words in (m.visibility, m.finalization):
            if words:
                lines.append(Text(indent + fit([(words, 0)], width - len(indent)), no_wrap=True))
        if m.last_failed and not m.completed and self.state.finished is None:  # the map's log says its first ones
            said = printable(m.last_failed)  # a provider's text: shown escaped, one line
            lines.append(Text(indent + said, "yellow", no_wrap=True, overflow="ellipsis"))
        return lines


def _bar(m: MapView, width: int) -> Text:
    total = m.total or 0
    share = 1.0 if m.completed else (min(1.0, m.done / total) if total else 0.0)
    filled = int(share * width)
    # What is left is drawn thinner: without colours (NO_COLOR) the bar still shows how far it is.
    return Text.assemble(("━" * filled, "green" if m.completed else "magenta"), ("─" * (width - filled), "grey23"))


def _with_waiting(finished: dict[str, Any]) -> dict[str, Any]:
    """The verdict reads the waiting boundaries with the stats."""
    return {**(finished.get("stats") or {}), "waiting": finished.get("waiting") or []}


def _style(line: str) -> str:
    return {"✓": "green", "✗": "red", "■": "yellow", "…": "cyan"}.get(line[:1], "")
