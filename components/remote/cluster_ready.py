"""Waits until Ray reports exactly the expected nodes, by fabric IP, with the expected GPUs.

Runs inside the Ray head container (`python3 - ARGS`, this file on stdin) and uses Ray's own view of the
cluster. First, at once: the head's address must be on the fabric interface (the container shares the node's
network), else no worker can join and that is the cause. Exit 0 when ready; exit 1 at the deadline with
`ray status`, the missing and the unexpected IPs.
"""

import argparse
import array
import fcntl
import logging
import socket
import struct
import subprocess
import sys
import time

SIOCGIFCONF, IFREQ_SIZE = 0x8912, 40  # every IPv4 address with its interface; struct ifreq on 64-bit Linux
# A raylet listens before it registers, so an address where nothing answers for this long after it registered is
# not its own: the cause is known, and Ray would only mark it dead after its heartbeats lapse.
SILENT_S = 5.0
RAYLET_STATES = ("silent", "refused", "up")  # of the raylets at one IP, the best counts


def parse_pairs(values):
    return dict(v.split("=", 1) for v in values)


def diagnose(alive, expected, management, gpus_expected, interface, unreachable=()):
    """Compares Ray's alive nodes [(ip, gpus)] with the expected {name: fabric ip}. Returns (ready, problems).

    `unreachable` holds the IPs whose raylet the head could not connect to: a node can register with an
    address that is not its own, and Ray keeps it alive until health checks time out.
    """
    by_ip: dict[str, int] = {}
    for ip, gpus in alive:
        by_ip[ip] = by_ip.get(ip, 0) + gpus
    problems = []
    for name, ip in expected.items():
        if ip not in by_ip:
            problems.append(f"{name} ({ip}) has not joined: check that {ip} is {name}'s address on {interface} "
                            f"and that its Ray worker container is running")
        elif ip in unreachable:
            problems.append(f"{name} registered with {ip}, but the head cannot reach its raylet there: {ip} is "
                            f"probably not {name}'s address on {interface}; fix its fabricIp")
    mgmt_owner = {ip: name for name, ip in management.items()}
    for ip in sorted(set(by_ip) - set(expected.values())):
        if ip in mgmt_owner:
            name = mgmt_owner[ip]
            problems.append(f"a Ray node registered with {name}'s management IP {ip} instead of its fabric IP "
                            f"{expected[name]}: Ray auto-detected the wrong interface (the seed's failure). Pin it "
                            f"with `ray start --node-ip-address={expected[name]}` and VLLM_HOST_IP={expected[name]}")
        else:
            problems.append(f"an unexpected Ray node registered with IP {ip}: no node of this cluster has that "
                            f"fabric IP; stop the stray `ray start` there or fix the node's fabricIp")
    gpus = sum(by_ip.values())
    if not problems and gpus != gpus_expected:
        problems.append(f"Ray sees {gpus:g} GPUs, expected {gpus_expected}: check --num-gpus and the GPU runtime")
    return not problems, problems


def interface_addresses(interface):
    """This host's IPv4 addresses on `interface`, or None when it has no such interface."""
    if interface not in {name for _, name in socket.if_nameindex()}:
        return None
    buf = array.array("B", bytes(IFREQ_SIZE * 512))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        length = struct.unpack("iL", fcntl.ioctl(s.fileno(), SIOCGIFCONF,
                                                 struct.pack("iL", len(buf), buf.buffer_info()[0])))[0]
    data = buf.tobytes()[:length]
    # An entry is the address's label (the interface, or "iface:alias"), then a sockaddr_in.
    return [socket.inet_ntoa(data[i + 20:i + 24]) for i in range(0, length, IFREQ_SIZE)
            if data[i:i + 16].split(b"\0", 1)[0].decode().split(":", 1)[0] == interface]


def head_problem(head, address, interface, addresses):
    """Why no worker can join a head advertised at `address`, given the head's `addresses` on the fabric `interface`
    (None: no such interface); None when it is one of them."""
    if addresses is None:
        return f"the head {head} has no interface {interface}: Ray's nodes meet over the fabric; fix fabricInterface"
    if address in addresses:
        return None
    have = ", ".join(addresses) or "no IPv4 address"
    return (f"the head {head}'s fabricIp {address} is not an address of {interface} on {head} ({interface} has "
            f"{have}): Ray's GCS is advertised there, so the workers cannot join over the fabric; set {head}'s "
            f"fabricIp to its address on {interface}")


def wait_for_port(host, port, deadline):
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=2).close()
            return True
        except OSError:
            time.sleep(0.5)
    return False


def node_table(address):
    """A function that lists the alive nodes as ray.nodes() does. It asks the GCS itself when this Ray has a GCS
    client that lists nodes; else, as a driver (ray.init), which registers a job and connects to the head's
    raylet first."""
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled; mypy sees no such name
        client = GcsClient(address=address)

        def from_gcs():
            return [{"NodeManagerAddress": info.node_manager_address, "NodeManagerPort": info.node_manager_port,
                     "Resources": dict(info.resources_total)}
                    for info in client.get_all_node_info().values() if info.state == 0]  # 0: ALIVE
        from_gcs()
        return from_gcs
    except (ImportError, AttributeError, TypeError):
        import ray
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        return lambda: [n for n in ray.nodes() if n["Alive"]]


def raylets_by_ip(nodes):
    """{ip: "up" | "refused" | "silent"}: a raylet there answers; none does, but the host refuses (a raylet that
    was replaced stays alive in Ray until its heartbeats lapse); or nothing at that address answers at all."""
    states: dict[str, str] = {}
    for n in nodes:
        ip = n["NodeManagerAddress"]
        try:
            socket.create_connection((ip, n["NodeManagerPort"]), timeout=2).close()
            state = "up"
        except ConnectionRefusedError:
            state = "refused"
        except OSError:
            state = "silent"
        states[ip] = max(states.get(ip, state), state, key=RAYLET_STATES.index)
    return states


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--expect", action="append", default=[], help="name=fabric-ip")
    p.add_argument("--management", action="append", default=[], help="name=management-ip")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--interface", required=True)
    p.add_argument("--timeout", type=float, required=True)
    a = p.parse_args()
    expected, management = parse_pairs(a.expect), parse_pairs(a.management)
    deadline = time.monotonic() + a.timeout
    host, port = a.address.rsplit(":", 1)
    head = next((name for name, ip in expected.items() if ip == host), None)
    problem = head and head_problem(head, host, a.interface, interface_addresses(a.interface))
    if problem:
        print(f"cluster not ready: {problem}", file=sys.stderr, flush=True)
        return 1
    print(f"waiting up to {a.timeout:.0f}s for {len(expected)} Ray nodes ({', '.join(expected.values())}) "
          f"with {a.gpus} GPUs", flush=True)
    problems = [f"Ray's GCS at {a.address} does not accept connections"]
    failed = f"cluster not ready after {a.timeout:.0f}s"
    if wait_for_port(host, int(port), deadline):
        alive_nodes = node_table(a.address)
        shown = None
        silent_since: dict[str, float] = {}
        while True:
            nodes = alive_nodes()
            raylets = raylets_by_ip(nodes)
            unreachable = {ip for ip, state in raylets.items() if state != "up"}
            now = time.monotonic()
            silent_since = {ip: silent_since.get(ip, now) for ip, state in raylets.items() if state == "silent"}
            ready, problems = diagnose([(n["NodeManagerAddress"], n.get("Resources", {}).get("GPU", 0))
                                        for n in nodes], expected, management, a.gpus, a.interface, unreachable)
            joined = sorted(n["NodeManagerAddress"] for n in nodes)
            if joined != shown:
                print(f"Ray nodes alive: {', '.join(joined) or 'none'}", flush=True)
                shown = joined
            if ready:
                print(f"cluster ready: {len(nodes)} nodes, {a.gpus} GPUs", flush=True)
                return 0
            lost = [ip for ip, since in silent_since.items() if ip in expected.values() and now - since >= SILENT_S]
            if lost:
                failed = (f"cluster not ready: nothing at {', '.join(lost)} has answered in the {SILENT_S:.0f}s "
                          f"since a raylet registered there")
                break
            if now >= deadline:
                break
            time.sleep(0.25)
    print(f"{failed}:", file=sys.stderr)
    for problem in problems:
        print(f"  - {problem}", file=sys.stderr)
    print("ray status:\n" + ray_status(a.address), file=sys.stderr)
    return 1


def ray_status(address):
    try:
        done = subprocess.run(["ray", "status", f"--address={address}"], capture_output=True, text=True, timeout=60)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(could not run ray status: {e})"


if __name__ == "__main__":
    sys.exit(main())
