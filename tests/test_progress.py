"""quantkit.progress: a bar on a terminal, a line every few seconds in a log, nothing with --quiet;
and every long command takes --quiet."""

from __future__ import annotations

import io
import time

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.progress import Progress, style


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_style_follows_the_stream_and_quiet():
    assert style(stream=Tty()) == "bar" and style(stream=io.StringIO()) == "lines"
    assert style(quiet=True, stream=Tty()) == "off"


def test_lines_every_few_seconds_and_a_last_one():
    out, clock = io.StringIO(), Clock()
    with Progress("convert", None, "B", "lines", every=5, stream=out, clock=clock) as p:
        p.reset(10_000_000)
        for _ in range(10):  # 1 MB a second for 10 s
            clock.t += 1
            p.update(1_000_000)
    assert out.getvalue().splitlines() == ["convert: 5.00MB of 10.0MB (50%), 5 s", "convert: 10.0MB of 10.0MB (100%), 10 s",
                                           "convert: 10.0MB of 10.0MB (100%), 10 s, done"]


def test_short_work_off_a_terminal_and_quiet_print_nothing():
    out, clock = io.StringIO(), Clock()
    with Progress("shard", 3, "window", "lines", every=5, stream=out, clock=clock) as p:
        clock.t += 4.9
        p.update(3)
    quiet = io.StringIO()
    with Progress("shard", 3, "window", "off", every=5, stream=quiet, clock=clock) as p:
        clock.t += 60
        p.update(3)
    assert out.getvalue() == "" and quiet.getvalue() == ""


def test_a_failure_says_stopped_not_done():
    out, clock = io.StringIO(), Clock()
    with pytest.raises(RuntimeError), Progress("eval accuracy", 4, "window", "lines", every=5, stream=out, clock=clock) as p:
        clock.t += 6
        p.update(1)
        raise RuntimeError
    assert out.getvalue().splitlines() == ["eval accuracy: 1 window of 4 windows (25%), 6 s",
                                           "eval accuracy: 1 window of 4 windows (25%), 6 s, stopped"]


def test_a_bar_on_a_terminal():
    out = Tty()
    with Progress("synth", 2, "window", "bar", stream=out) as p:
        time.sleep(0.6)  # the bar waits half a second before it shows
        p.update(2)
    assert "synth" in out.getvalue() and "2/2" in out.getvalue()


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="progress style must be one of bar, lines, off"):
        Progress("x", style="loud")


@pytest.mark.parametrize("cmd", [["synth"], ["convert"], ["shard"], ["eval", "accuracy"], ["eval", "expert-load"]])
def test_every_long_command_takes_quiet(cmd):
    r = CliRunner().invoke(main, [*cmd, "--help"])
    assert r.exit_code == 0 and "-q, --quiet" in r.output
