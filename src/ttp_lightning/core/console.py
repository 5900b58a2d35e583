"""What the console shows, within its width: tables (rich) whose headers fold onto more lines instead of widening
the table, and notes wrapped with an indent. The width is the terminal's, at most WIDTH (a pipe or a file gets
WIDTH), so a 100-column terminal, a cluster log and `make run > log.txt` read the same lines."""

import io
import logging
import re
import shutil
import textwrap
import threading
import time

from rich import box
from rich.console import Console
from rich.table import Table

WIDTH = 100  # the widest line the console prints
NARROWEST = 60  # below this a table stays at this width (a terminal that narrow wraps it itself)

# a dashed line under the header and nothing else: the look of the earlier hand-aligned tables, in ASCII so a
# log file or a pipe shows the same characters as a terminal
RULE_UNDER_HEADER = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def console_width() -> int:
    """The terminal's columns, at most WIDTH (WIDTH when stdout is not a terminal: COLUMNS, then WIDTH)."""
    return max(NARROWEST, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))


def fold_long_lines(text: str, width: int = WIDTH) -> str:
    """`text` with every line wider than `width` folded at spaces: a `name: a, b, c` line (Hydra's config groups)
    continues under its first value, any other under its own indent plus four; words are never broken."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        head = re.match(r"\s*[\w/@.-]+: ", line)
        hang = " " * (len(head.group(0)) if head else indent + 4)
        out.extend(textwrap.wrap(line, width, initial_indent=" " * indent, subsequent_indent=hang,
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def table(rows: list[list[str]], width: int | None = None) -> str:
    """`rows` (a header, then the rows; the first column a label, the others values) as aligned text within
    `width` columns: values right-aligned and never broken; headers folded onto more lines at word boundaries,
    the largest saving first, until the table fits (or nothing more folds); a dashed line under them."""
    width = width or console_width()
    header, *body = [[str(cell) for cell in row] for row in rows]
    values = [max([len(row[i]) for row in body] or [0]) for i in range(len(header))]
    titles = list(header)

    def narrowest(i: int) -> int:  # a column is never narrower than a value or a word of its header
        return max(values[i], *(len(word) for word in header[i].split()))

    def total() -> int:
        return sum(max(values[i], *(len(line) for line in titles[i].split("\n"))) for i in range(len(titles))) \
            + 2 * (len(titles) - 1)

    for i in sorted(range(len(header)), key=lambda i: narrowest(i) - len(header[i])):
        if total() <= width:
            break
        titles[i] = "\n".join(textwrap.wrap(header[i], narrowest(i), break_long_words=False)) or header[i]
    grid = Table(box=RULE_UNDER_HEADER, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="",
                 show_header=True)
    for i, title in enumerate(titles):
        grid.add_column(title, justify="left" if i == 0 else "right", no_wrap=True, vertical="bottom")
    for row in body:
        grid.add_row(*row)
    buffer = io.StringIO()
    Console(file=buffer, width=max(width, total()), color_system=None, force_terminal=False, highlight=False,
            emoji=False, markup=False, legacy_windows=False).print(grid, crop=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def wrapped(text: str, width: int | None = None, indent: str = "  ") -> str:
    """`text` (one paragraph per line) wrapped within `width` columns, each continuation line indented by
    `indent` more than the line it continues."""
    width = width or console_width()
    out = []
    for line in text.splitlines():
        lead = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.strip(), width=width, initial_indent=lead, subsequent_indent=lead + indent,
                             break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(out)


class ConsoleFormatter(logging.Formatter):
    """Log lines for the console (conf/hydra/default.yaml's job_logging): `[HH:MM:SS] message`, a level word
    before the message when it is not INFO (`warning: `), wrapped within the console's width; the log file keeps
    Hydra's full format (date, logger, level)."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        text = wrapped(f"[{self.formatTime(record, '%H:%M:%S')}] {level}{record.getMessage()}", indent="  ")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class Pace:
    """When a long loop next says how far it is: `due(done, total)` is None until at least `every` seconds have
    passed since the last line (or the start), then (seconds since the start, seconds left at the pace since the
    last progress line: a loop's steps need not take the same time, robust Alg 1's later rounds train at a larger
    radius). `beat()` is a line with no count (a step still running): seconds since the start when one is due, else
    None; it resets the interval, not the pace. Shared by the training phases' lines in a pipe
    (fit.progress.StageLine) and Paced."""

    def __init__(self, every: float = 60.0, done: int = 0, clock=time.perf_counter):
        self.every, self._clock = every, clock
        self.started = self.last_line = self.marked = clock()
        self.marked_done = done

    def due(self, done: int, total: int) -> tuple[float, float] | None:
        now = self._clock()
        if now - self.last_line < self.every:
            return None
        pace = (now - self.marked) / max(1, done - self.marked_done)
        self.last_line = self.marked = now
        self.marked_done = done
        return now - self.started, pace * max(0, total - done)

    def beat(self) -> float | None:
        now = self._clock()
        if now - self.last_line < self.every:
            return None
        self.last_line = now
        return now - self.started


class Paced:
    """Progress lines for a long loop that is not a training fit (the attack table, the relearning attack):
    `step(done, total)` logs `<label>: done of total <unit>, T s, ~L s left` when Pace says it is due, so a pipe
    or a cluster log hears from the run at least once a minute and a short loop says nothing. Used as a context
    manager it also keeps a heartbeat: a step can take longer than a minute (one APGD run over a chunk of
    images), so while the loop runs a thread logs `<label>: done of total <unit>, T s` whenever `every` seconds
    have passed without a line."""

    def __init__(self, label: str, unit: str, every: float = 60.0, log: logging.Logger | None = None,
                 clock=time.perf_counter):
        self.label, self.unit = label, unit
        self.log = log or logging.getLogger(__name__)
        self.pace = Pace(every, clock=clock)
        self.done, self.total = 0, 0
        self._lock, self._stop, self._beat = threading.Lock(), threading.Event(), None

    def step(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = done, total
            if done >= total or (due := self.pace.due(done, total)) is None:
                return
            elapsed, left = due
            self.log.info("%s: %d of %d %s, %.0f s, ~%.0f s left", self.label, done, total, self.unit, elapsed,
                          left)

    def __enter__(self) -> "Paced":  # noqa: PYI034 -- Self needs typing_extensions on 3.10
        self._beat = threading.Thread(target=self._heartbeat, name=f"paced {self.label}", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._beat.join()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.pace.every / 4):
            with self._lock:
                if (elapsed := self.pace.beat()) is not None:
                    done = f"{self.done} of {self.total} {self.unit}, " if self.total else ""
                    self.log.info("%s: %s%.0f s", self.label, done, elapsed)
