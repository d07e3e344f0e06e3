"""Prints the lab test's per-phase time and memory at the end of the run (collected by test_lab.MEASURED)."""


def pytest_terminal_summary(terminalreporter):
    from test_lab import MEASURED  # imported late: the module exists only once collected

    if not MEASURED:
        return
    tr = terminalreporter
    tr.section("lab phases: time and memory")
    tr.write_line(f"{'phase':<34} {'seconds':>8} {'host used MiB':>14} {'delta MiB':>10}  nodes (cgroup MiB)")
    for m in MEASURED:
        nodes = " ".join(f"{k.removeprefix('svl-lab-')}={v}" for k, v in m["nodes"].items())
        tr.write_line(f"{m['phase']:<34} {m['seconds']:8.1f} {m['host_used_mib']:14.0f} "
                      f"{m['host_delta_mib']:+10.0f}  {nodes}")
