"""The `watchdog:` section of the stack config: how the keepers watch and relaunch a deployment (docs/watchdog.md).

Its own small spec and parser, called once from validate.stack_keys (the port checked against the cluster's
by loader.load), so that it stays apart from the rest of the config.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Section


@dataclass(frozen=True)
class WatchdogSpec:
    enabled: bool = True
    interval_s: int = 30  # between two probes of the API (one real completion each)
    probe_timeout_s: int = 60  # one probe's bound; a wedged engine answers none
    failures: int = 3  # probes failed in a row before the group is relaunched
    backoff_initial_s: int = 10  # the pause before the first relaunch, doubled for each next one in the window
    backoff_max_s: int = 600
    max_restarts: int = 3  # relaunches within `window_s`; one more and the keeper gives up
    window_s: int = 3600
    port: int = 29511  # the leader's, on the head's fabric address, where the other nodes' keepers report
    load_timeout_s: int = 2400  # a relaunched group's bound to answer again: timeouts.serveReadySeconds


def parse(w: Section, load_timeout_s: int) -> WatchdogSpec:
    d = WatchdogSpec()
    backoff = w.section("backoff")
    spec = WatchdogSpec(
        enabled=w.bool("enabled", d.enabled),
        interval_s=w.int("intervalSeconds", d.interval_s, lo=1, hi=3600),
        probe_timeout_s=w.int("probeTimeoutSeconds", d.probe_timeout_s, lo=1, hi=3600),
        failures=w.int("failures", d.failures, lo=1, hi=100),
        backoff_initial_s=backoff.int("initialSeconds", d.backoff_initial_s, lo=0, hi=3600),
        backoff_max_s=backoff.int("maxSeconds", d.backoff_max_s, lo=0, hi=24 * 3600),
        max_restarts=w.int("maxRestarts", d.max_restarts, lo=0, hi=1000),
        window_s=w.int("windowSeconds", d.window_s, lo=60, hi=7 * 24 * 3600),
        port=w.port("port", d.port),
        load_timeout_s=load_timeout_s)
    if spec.backoff_max_s < spec.backoff_initial_s:
        raise backoff.error("maxSeconds", spec.backoff_max_s,
                            f"a number of seconds from backoff.initialSeconds ({spec.backoff_initial_s}) up")
    backoff.done()
    w.done()
    return spec


def check_port(w: Section, port: int, fixed: dict[int, str], worker_ports: tuple[int, int]) -> None:
    """The leader's port must differ from every port of the cluster, and stay out of Ray's workers' range."""
    low, high = worker_ports
    if port in fixed:
        raise w.error("port", port, "a port no Ray, mp or API port uses", f"is {port}, which {fixed[port]} also uses")
    if low <= port <= high:
        raise w.error("port", port, f"a port outside Ray's worker ports ({low}-{high})",
                      f"is {port}, inside Ray's worker ports")
