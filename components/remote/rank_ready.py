"""Waits until a node's `mp` rank can reach the master, and names the cause when it cannot (the seed's c10d failure).

Runs on the node itself (`python3 - ARGS`, this file on stdin), where it sees the node's Docker and, the rank's
network being the host's, what the rank sees:
  * on the head, the master address must be one of the fabric interface's addresses: the other ranks reach it
    over the fabric. If it is not, that is the cause, said at once, with the address to use;
  * on every node, the rank's container must keep running, and the master's port must answer at the master
    address. A rank whose container exits shows its last log lines.
Exit 0 when reachable; exit 1 with one plain diagnosis at the deadline.
"""

import argparse
import json
import socket
import subprocess
import sys
import time


def run(argv):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout + done.stderr


def interface_addresses(interface):
    code, out = run(["ip", "-o", "-4", "addr", "show", "dev", interface])
    return [line.split()[3].split("/")[0] for line in out.splitlines() if " inet " in line] if code == 0 else None


def container_state(name):
    code, out = run(["docker", "inspect", "-f", "{{json .State}}", name])
    return json.loads(out) if code == 0 else None


def logs_tail(name, lines=30):
    return run(["docker", "logs", "--tail", str(lines), name])[1]


def head_problem(node, master, interface):
    """Why the other ranks cannot reach a master at `master` on this head, or None."""
    addresses = interface_addresses(interface)
    if addresses is None:
        return f"{node} has no interface {interface}: the ranks meet over the fabric; fix fabricInterface"
    if master not in addresses:
        have = ", ".join(addresses) or "no IPv4 address"
        return (f"the master address {master} (the head {node}'s fabricIp) is not an address of {interface} on "
                f"{node} ({interface} has {have}): the other ranks cannot reach it over the fabric; set {node}'s "
                f"fabricIp to its address on {interface}")
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--node", required=True)
    p.add_argument("--container", required=True)
    p.add_argument("--master", required=True, help="addr:port")
    p.add_argument("--head-node", required=True)
    p.add_argument("--interface", required=True)
    p.add_argument("--timeout", type=float, required=True)
    a = p.parse_args()
    addr, port = a.master.rsplit(":", 1)
    deadline = time.monotonic() + a.timeout
    if a.node == a.head_node:
        problem = head_problem(a.node, addr, a.interface)
        if problem:
            print(f"rank 0 on {a.node}: {problem}", file=sys.stderr, flush=True)
            return 1
    print(f"waiting up to {int(a.timeout)}s for the rank on {a.node} ({a.container}) to reach the master at "
          f"{addr}:{port}", flush=True)
    last = "no attempt yet"
    while True:
        state = container_state(a.container)
        if state is None or not state.get("Running"):
            shown = "is missing" if state is None else f"exited with code {state.get('ExitCode')}"
            print(f"the rank on {a.node} ({a.container}) {shown} while reaching the master at {addr}:{port}. "
                  f"Last lines of `docker logs {a.container}`:\n{logs_tail(a.container)}", file=sys.stderr,
                  flush=True)
            return 1
        try:
            socket.create_connection((addr, int(port)), timeout=2).close()
            print(f"the rank on {a.node} reaches the master at {addr}:{port}", flush=True)
            return 0
        except OSError as err:
            last = err.strerror or str(err)
        if time.monotonic() >= deadline:
            print(f"{a.node} cannot reach the master at {addr}:{port} (the head {a.head_node}'s fabricIp, its "
                  f"rank's --master-addr) after {int(a.timeout)}s: {last}. The ranks meet over the fabric: check "
                  f"that {addr} is {a.head_node}'s address on {a.interface} (else fix its fabricIp), and that "
                  f"{a.node} reaches it on {a.interface}.", file=sys.stderr, flush=True)
            return 1
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
