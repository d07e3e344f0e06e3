"""Reads what a cluster entry needs from one node, and changes nothing: the fabric interface, its IPv4 and MTU, the
RoCE HCAs, the GPUs, Docker and its runtimes, the hard limits. Sent over SSH on stdin to `python3 -` by
scripts/discover (components/nodes/discovery.py); prints one JSON line after MARK. Python 3 standard library only.

Usage: python3 - '{"gpuProbe": null}'
"""

import json
import os
import re
import resource
import shutil
import subprocess
import sys

MARK = "SPARK_VLLM_DISCOVER "
TIMEOUT_S = 15
# Interfaces that are never the fabric: loopback and the ones Docker and libvirt make.
VIRTUAL = re.compile(r"^(lo|docker\d*|br-.*|veth.*|virbr.*|cni.*|flannel.*|tun.*|tap.*)$")


def sh(argv):
    """stdout of a bounded command; None when the tool is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout if done.returncode == 0 else None


def roce_ports():
    """netdev -> its HCA, for the RoCE ports that are up: ibdev2netdev where installed, else /sys."""
    ports = {}
    out = sh(["ibdev2netdev"])
    if out is not None:
        for line in out.splitlines():  # "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)"
            match = re.match(r"(\S+) port \d+ ==> (\S+) \((\w+)\)", line)
            if match and match.group(3) == "Up":
                ports[match.group(2)] = match.group(1)
        return ports
    for netdev in sorted(os.listdir("/sys/class/net")):
        hcas = f"/sys/class/net/{netdev}/device/infiniband"
        if os.path.isdir(hcas) and read(f"/sys/class/net/{netdev}/operstate") == "up":
            for hca in sorted(os.listdir(hcas)):
                ports[netdev] = hca
    return ports


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def fabric(roce):
    """The interfaces that may be the fabric, up and with an IPv4 address: the RoCE ports where there are any, else
    the ones that are neither virtual nor the default route's."""
    links = json.loads(sh(["ip", "-j", "addr", "show"]) or "[]")
    default = {route.get("dev") for route in json.loads(sh(["ip", "-j", "route", "show", "default"]) or "[]")}
    found = []
    for link in links:
        name = link["ifname"]
        ipv4 = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"]
        up = "UP" in link.get("flags", []) and link.get("operstate") != "DOWN"
        if up and ipv4 and not VIRTUAL.match(name) and (name in roce or (not roce and name not in default)):
            found.append({"name": name, "ipv4": ipv4, "mtu": link.get("mtu")})
    return found


def gpus(spec):
    argv = ["sh", "-c", spec["gpuProbe"]] if spec.get("gpuProbe") else ["nvidia-smi", "-L"]
    out = sh(argv)
    if out is None:
        return None
    return [re.sub(r"\s*\(UUID:.*$", "", line.split(":", 1)[1]).strip()
            for line in out.splitlines() if re.match(r"\s*GPU \d+:", line)]


def docker():
    version = sh(["docker", "version", "--format", "{{.Server.Version}}"])
    runtimes = sh(["docker", "info", "--format", "{{json .Runtimes}}"])
    return {"server": version.strip() if version else None,
            "runtimes": sorted(json.loads(runtimes)) if runtimes else []}


def limits():
    """The hard limits a container on this node can be given at most (-1: unlimited)."""
    def hard(which):
        value = resource.getrlimit(which)[1]
        return -1 if value == resource.RLIM_INFINITY else value
    return {"memlock": hard(resource.RLIMIT_MEMLOCK), "nofile": hard(resource.RLIMIT_NOFILE),
            "stack": hard(resource.RLIMIT_STACK)}


def main():
    spec = json.loads(sys.argv[1])
    roce = roce_ports()
    facts = {"fabric": fabric(roce), "roce": roce, "gpus": gpus(spec), "docker": docker(), "limits": limits(),
             "infiniband": os.path.isdir("/dev/infiniband")}
    print(MARK + json.dumps(facts))


if __name__ == "__main__":
    main()
