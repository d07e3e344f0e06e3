"""The benchmark's event-log tail must never end the run it times (bench/timing.py)."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import timing  # noqa: E402


def test_two_events_on_one_line_and_a_torn_line_are_read_without_raising(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text('{"a": 1}{"b": 2}\n{"c": 3} {"d"\n{"e": 5}\n{"partial": ')
    tail = timing._Tail(log)
    assert tail.read() == [{"a": 1}, {"b": 2}, {"c": 3}, {"e": 5}]
    with log.open("a") as f:
        f.write('6}\n')
    assert tail.read() == [{"partial": 6}]


def test_a_file_started_anew_is_read_from_its_start(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(5)))
    tail = timing._Tail(log)
    assert len(tail.read()) == 5
    log.write_text('{"n": 9}\n')
    assert tail.read() == [{"n": 9}]


def test_a_run_whose_bookkeeping_fails_leaves_no_pulumi_behind(tmp_path, monkeypatch):
    """A `pulumi` left running would hold the stack's lock against the benchmark's clean-up `destroy`."""
    marker = tmp_path / "still-running"
    cmd = [sys.executable, "-c", f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).touch()"]

    def broken(self):
        raise ValueError("bookkeeping")

    monkeypatch.setattr(timing._Tail, "read", broken)
    try:
        timing.run(cmd, tmp_path, {}, event_log=tmp_path / "events.jsonl")
    except ValueError:
        pass
    else:
        raise AssertionError("the tail's error should reach the caller")
    time.sleep(2.5)
    assert not marker.exists()
