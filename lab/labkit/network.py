"""Host side of the lab networks: two internal docker bridges and the host's route to the fabric.

Both bridges are `--internal`, so docker's iptables drops anything forwarded between them and the
outside world: nothing from a node can leave the machine. The fabric bridge has no host address
(inhibit_ipv4) and the host holds an `unreachable` route for it, so the host itself can reach node2..N
only through node1, as a workstation reaches a Spark cluster.
"""
from pathlib import Path

from .config import (FABRIC_CIDR, FABRIC_GATEWAY, FABRIC_MTU, FABRIC_NET, LABEL, MGMT_CIDR, MGMT_GATEWAY,
                     MGMT_NET, SPEC_LABEL)
from .rootfs import hash_inputs
from .run import LabError, log, out, run

NETWORKS = {
    MGMT_NET: ["--subnet", MGMT_CIDR, "--gateway", MGMT_GATEWAY, "-o", f"com.docker.network.bridge.name={MGMT_NET}"],
    FABRIC_NET: ["--subnet", FABRIC_CIDR, "--gateway", FABRIC_GATEWAY,
                 "-o", f"com.docker.network.bridge.name={FABRIC_NET}",
                 "-o", "com.docker.network.bridge.inhibit_ipv4=true",
                 "-o", f"com.docker.network.driver.mtu={FABRIC_MTU}"],
}


def ensure_networks() -> None:
    for name, opts in NETWORKS.items():
        spec = hash_inputs(*opts)
        proc = run(["docker", "network", "inspect", "-f", f'{{{{index .Labels "{SPEC_LABEL}"}}}}', name],
                   check=False, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip() == spec:
            continue
        if proc.returncode == 0:
            log(f"{name} has other settings: recreating it and the nodes on it")
            attached = out(["docker", "network", "inspect", "-f", "{{range .Containers}}{{.Name}} {{end}}", name])
            if attached.split():
                run(["docker", "rm", "-f", *attached.split()], timeout=120)
            run(["docker", "network", "rm", name])
        run(["docker", "network", "create", "--driver", "bridge", "--internal", "--label", f"{LABEL}=1",
             "--label", f"{SPEC_LABEL}={spec}", *opts, name])
        log(f"created network {name}")


def host_fabric_addresses() -> list[str]:
    """Any host address in the fabric subnet or on the fabric bridge (IPv6 link-local included)."""
    found = out(["ip", "-o", "-4", "addr", "show", "to", FABRIC_CIDR]).splitlines()
    if Path(f"/sys/class/net/{FABRIC_NET}").exists():
        found += out(["ip", "-o", "addr", "show", "dev", FABRIC_NET]).splitlines()
    return sorted(set(found))


def ensure_route() -> None:
    # The kernel gives every bridge an IPv6 link-local address; the fabric bridge must have none.
    no_v6 = Path(f"/proc/sys/net/ipv6/conf/{FABRIC_NET}/disable_ipv6")
    if no_v6.exists() and no_v6.read_text().strip() != "1":
        no_v6.write_text("1\n")
    if host_fabric_addresses():
        raise LabError(f"the host has an address on the fabric {FABRIC_CIDR}: {host_fabric_addresses()}")
    if not fabric_route_present():
        run(["ip", "route", "add", "unreachable", FABRIC_CIDR])
        log(f"host route: unreachable {FABRIC_CIDR}")


def fabric_route_present() -> bool:
    return out(["ip", "route", "show", "type", "unreachable", FABRIC_CIDR]) != ""


def remove_route() -> bool:
    if fabric_route_present():
        run(["ip", "route", "del", "unreachable", FABRIC_CIDR])
        return True
    return False
