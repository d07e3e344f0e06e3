"""In CI (CI=true), a skipped test fails the run: a skip there means something the tests need was not installed
or started, and a green run would hide it."""

import os


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if os.environ.get("CI") == "true" and skipped:
        terminalreporter.section("CI: skipped tests fail the run", red=True)
        for report in skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            terminalreporter.write_line(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if os.environ.get("CI") == "true" and reporter and reporter.stats.get("skipped") and exitstatus == 0:
        session.exitstatus = 1
