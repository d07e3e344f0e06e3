"""The text helpers: tables, sizes and last lines, with the exact strings they print."""

from components.text import last_line, size, table


def test_a_table_pads_every_column_but_the_last():
    assert table([("node", "check", "result", ""), ("spark10", "gpus", "FAIL", "no GPU")]).splitlines() == [
        "node     check  result",
        "spark10  gpus   FAIL    no GPU"]
    assert table([("ssh spark1", "ok", "docker 28"), ("x", "FAIL", "")], indent="  ") == (
        "  ssh spark1  ok    docker 28\n"
        "  x           FAIL")


def test_sizes_in_binary_units():
    assert [size(n) for n in (1000, 1024, 4 * 1024 * 1024, 6 * (1 << 30), 3 * (1 << 40))] == [
        "1000 B", "1.0 KiB", "4.0 MiB", "6.0 GiB", "3072.0 GiB"]


def test_the_last_line_that_says_something():
    assert last_line("Warning: added\n  ssh: connect to host x port 22: Connection refused  \n\n") == (
        "ssh: connect to host x port 22: Connection refused")
    assert last_line(" \n") == "(no output)"
