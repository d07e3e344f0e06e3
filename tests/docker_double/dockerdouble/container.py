"""`docker:index/container:Container`: the subset of pulumi-docker 5.2.0's Container the program may use.

Behaviour follows the real plugin (kreuzwerker/terraform-provider-docker v4.5.0, bridged by pulumi-docker, as
read in its sources and run against the lab): Create checks the image is on the node, creates and starts the
container, and does not wait for it to keep running; Read of a stopped container keeps it, reports `mustRun`
false and its exit code, so the next update starts the same container again; Delete force-removes.
"""

import re
import time

from providerkit import values
from providerkit.rpc import CheckFailures

from . import props
from .dockerapi import DockerError, DockerHost

TOKEN = "docker:index/container:Container"
LABEL = "Container"
POLL_S = 0.1               # between tries of a removal already in progress

P = props.Prop
TABLE = {
    "name": P(),
    "image": P(),
    "command": P(computed=True),
    "entrypoints": P(computed=True),
    "envs": P(computed=True, is_set=True),
    "labels": P(computed=True, is_set=True, fields=frozenset({"label", "value"}),
                required_fields=frozenset({"label", "value"})),
    "networkMode": P(),
    "ipcMode": P(computed=True),
    "pidMode": P(),
    "init": P(),
    "shmSize": P(computed=True),
    "gpus": P(),
    "devices": P(is_set=True, fields=frozenset({"hostPath", "containerPath", "permissions"}),
                 required_fields=frozenset({"hostPath"})),
    # ForceNew upstream (an unknown value replaces), yet the real plugin plans a known change as an in-place
    # update, and Docker keeps the old mount.
    "mounts": P(known_change_in_place=True, is_set=True, fields=frozenset({"target", "source", "type", "readOnly"}),
                required_fields=frozenset({"target", "type"})),
    "ulimits": P(is_set=True, fields=frozenset({"name", "soft", "hard"}),
                 required_fields=frozenset({"name", "soft", "hard"})),
    "capabilities": P(fields=frozenset({"adds", "drops"})),
    "hostname": P(computed=True),
    "user": P(empty_is_noop=True),
    "workingDir": P(empty_is_noop=True),
    "restart": P(force_new=False, default="no"),
    "maxRetryCount": P(force_new=False),
    "mustRun": P(force_new=False, default=True),
}
# Upstream properties the program never sets, whose schema defaults the bridge's Check writes into the inputs.
# The double implements none of them; it writes them as upstream does, so that state reads the same to both.
UPSTREAM_DEFAULTS = {"containerReadRefreshTimeoutMilliseconds": 15000, "removeVolumes": True, "start": True,
                     "waitTimeout": 60}
RESTART_RE = re.compile(r"^(no|on-failure|always|unless-stopped)$")
MOUNT_TYPES = ("bind", "volume", "tmpfs")
GPUS_RE = re.compile(r'^(all|\d+|"?device=[\w,:-]+"?)$')


def check(news: dict) -> tuple[dict, CheckFailures]:
    failures = CheckFailures()
    props.check_names(LABEL, TABLE, news, failures)
    for required in ("name", "image"):
        if required not in news:
            failures.add(required, f"Missing required property '{required}'")
    known = {k: values.plain(v) for k, v in news.items() if k in TABLE and not values.contains_unknown(v)}
    if "restart" in known and not RESTART_RE.match(known["restart"]):
        failures.add("restart", f"restart {known['restart']!r} must be one of no, on-failure, always, unless-stopped")
    for index, mount in enumerate(known.get("mounts") or []):
        if isinstance(mount, dict) and "type" in mount and mount["type"] not in MOUNT_TYPES:
            failures.add(f"mounts[{index}].type", f"mount type {mount.get('type')!r} must be one of {MOUNT_TYPES}")
    if known.get("shmSize", 0) < 0:
        failures.add("shmSize", "shmSize must be >= 0 (MB)")
    if "gpus" in known and not GPUS_RE.match(known["gpus"]):
        failures.add("gpus", f"gpus {known['gpus']!r}: the docker test double supports 'all', a count, "
                             "or 'device=ID[,ID]'")
    if any(part == "" for part in known.get("command") or []):
        failures.add("command", "values for command may not be empty")
    return {**UPSTREAM_DEFAULTS, **props.with_defaults(TABLE, news)}, failures


def diff(olds: dict, news: dict) -> dict[str, int]:
    return props.diff(TABLE, olds, news)


def _device_requests(gpus: str) -> list[dict]:
    request = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
    if gpus == "all":
        request["Count"] = -1
    elif gpus.isdigit():
        request["Count"] = int(gpus)
    else:
        request["DeviceIDs"] = gpus.strip('"').split("=", 1)[1].split(",")
    return [request]


def _canonical_caps(caps: list | None) -> list | None:
    """As Docker's Go client sends them (normalizeCapabilities): upper case, CAP_-prefixed, except ALL."""
    if not caps:
        return None
    upper = [c.upper() for c in caps]
    return [c if c == "ALL" or c.startswith("CAP_") else f"CAP_{c}" for c in upper]


def create_body(p: dict) -> dict:
    """The Engine API `containers/create` body for plain (unwrapped) checked inputs."""
    config = {"Image": p["image"], "Hostname": p.get("hostname", ""), "User": p.get("user", ""),
              "WorkingDir": p.get("workingDir", ""), "Tty": False, "OpenStdin": False}
    if "command" in p:
        config["Cmd"] = p["command"]
    if "entrypoints" in p:
        config["Entrypoint"] = p["entrypoints"]
    if "envs" in p:
        config["Env"] = p["envs"]
    if "labels" in p:
        config["Labels"] = {item["label"]: item["value"] for item in p["labels"]}
    host = {
        "RestartPolicy": {"Name": p.get("restart", "no"), "MaximumRetryCount": p.get("maxRetryCount", 0)},
        "Init": bool(p.get("init", False)),
    }
    if "networkMode" in p:
        host["NetworkMode"] = p["networkMode"]
    if "ipcMode" in p:
        host["IpcMode"] = p["ipcMode"]
    if "pidMode" in p:
        host["PidMode"] = p["pidMode"]
    if "shmSize" in p:
        host["ShmSize"] = p["shmSize"] * 1024 * 1024
    if "gpus" in p:
        host["DeviceRequests"] = _device_requests(p["gpus"])
    if "devices" in p:
        host["Devices"] = [{"PathOnHost": d["hostPath"], "PathInContainer": d.get("containerPath") or d["hostPath"],
                            "CgroupPermissions": d.get("permissions") or "rwm"} for d in p["devices"]]
    if "mounts" in p:
        host["Mounts"] = [{"Target": m["target"], "Source": m.get("source", ""), "Type": m["type"],
                           "ReadOnly": bool(m.get("readOnly", False))} for m in p["mounts"]]
    if "ulimits" in p:
        host["Ulimits"] = [{"Name": u["name"], "Soft": u["soft"], "Hard": u["hard"]} for u in p["ulimits"]]
    if "capabilities" in p:
        host["CapAdd"] = _canonical_caps(p["capabilities"].get("adds"))
        host["CapDrop"] = _canonical_caps(p["capabilities"].get("drops"))
    config["HostConfig"] = host
    return config


def preview_outputs(news: dict) -> dict:
    outputs = dict(news)
    for key, prop in TABLE.items():
        if prop.computed and key not in news:
            outputs[key] = values.UNKNOWN
    outputs["id"] = values.UNKNOWN
    return outputs


def _computed_outputs(info: dict, given: dict) -> dict:
    """Values docker chose for Optional+Computed properties the program left unset (pulumi-docker reads them)."""
    read = {
        "command": info["Config"].get("Cmd") or [],
        "entrypoints": info["Config"].get("Entrypoint") or [],
        "hostname": info["Config"].get("Hostname", ""),
        "ipcMode": info["HostConfig"].get("IpcMode", ""),
        "shmSize": info["HostConfig"].get("ShmSize", 0) // (1024 * 1024),
    }
    computed = {k: v for k, v in read.items() if k not in given}
    # Computed outputs of upstream's that the double does not implement, as upstream reads them back.
    config, host = info["Config"], info["HostConfig"]
    computed.update({
        "attach": False, "logs": False, "wait": False,
        "memoryReservation": host.get("MemoryReservation", 0) // (1024 * 1024),
        "readOnly": host.get("ReadonlyRootfs", False), "rm": host.get("AutoRemove", False),
        "securityOpts": host.get("SecurityOpt") or [], "stdinOpen": config.get("OpenStdin", False),
        "tty": config.get("Tty", False),
        "networkDatas": [{"networkName": name, "ipAddress": n.get("IPAddress", ""),
                          "ipPrefixLength": n.get("IPPrefixLen", 0), "gateway": n.get("Gateway", ""),
                          "globalIpv6Address": n.get("GlobalIPv6Address", ""),
                          "globalIpv6PrefixLength": n.get("GlobalIPv6PrefixLen", 0),
                          "ipv6Gateway": n.get("IPv6Gateway", ""), "macAddress": n.get("MacAddress", "")}
                         for name, n in sorted(((info.get("NetworkSettings") or {}).get("Networks") or {}).items())],
    })
    return computed


def remove(client: DockerHost, cid: str) -> None:
    """Force-remove with its anonymous volumes (removeVolumes defaults to true); already gone is fine."""
    deadline = time.monotonic() + 30
    while True:
        try:
            client.call("DELETE", f"/containers/{cid}", query={"force": "true", "v": "true"})
            return
        except DockerError as err:
            if err.status == 404:
                return
            if err.status == 409 and "already in progress" in str(err) and time.monotonic() < deadline:
                time.sleep(POLL_S)
                continue
            raise


def create(client: DockerHost, news: dict) -> tuple[str, dict]:
    p = values.plain(news)
    if client.inspect("images", p["image"]) is None:
        raise RuntimeError(f"Unable to create container {p['name']!r} with image {p['image']!r}: the image is not "
                           f"present on {client.host}; pulumi-docker would pull it here, and the docker test "
                           "double never pulls")
    created = client.call("POST", "/containers/create", body=create_body(p), query={"name": p["name"]})
    cid = created["Id"]
    try:
        client.call("POST", f"/containers/{cid}/start")
    except BaseException:
        remove(client, cid)
        raise
    # Upstream returns once started: a container that exits at once is still a successful create.
    info = client.inspect("containers", cid) or {"Config": {}, "HostConfig": {}}
    outputs = dict(news)
    outputs.update(_computed_outputs(info, news))
    outputs["id"] = cid
    return cid, outputs


def read(client: DockerHost, cid: str, state: dict, inputs: dict) -> tuple[str, dict, dict]:
    """(id, outputs, inputs); id "" means gone."""
    info = client.inspect("containers", cid)
    if info is None:
        return "", {}, {}
    status = info["State"]
    outputs = dict(state) if state else {"name": info["Name"].lstrip("/"), "image": info["Config"]["Image"]}
    outputs["id"] = cid
    new_inputs = dict(inputs) if inputs else {k: v for k, v in outputs.items() if k in TABLE}
    host = info["HostConfig"]
    policy = host["RestartPolicy"]
    # What upstream reads back from Docker among the properties the double has (envs and labels it never reads).
    live = {"restart": policy.get("Name") or "no", "maxRetryCount": policy.get("MaximumRetryCount", 0)}
    caps = {key: host.get(field) for key, field in (("adds", "CapAdd"), ("drops", "CapDrop")) if host.get(field)}
    if caps:
        live["capabilities"] = caps  # as Docker stores them: CAP_-prefixed
    outputs.pop("exitCode", None)
    if not status["Running"]:
        outputs["exitCode"] = status["ExitCode"]
        live["mustRun"] = False  # upstream's way to make the next update start it again
    for key, value in live.items():
        if key in ("restart", "capabilities", "mustRun") or value or key in outputs:
            outputs[key] = values.like(outputs.get(key), value)
            new_inputs[key] = values.like(new_inputs.get(key), value)
    return cid, outputs, new_inputs


def update(client: DockerHost, cid: str, olds: dict, news: dict, preview: bool) -> dict:
    outputs = dict(olds)
    for key, prop in TABLE.items():
        if key in news:
            outputs[key] = news[key]
        elif not prop.computed:
            outputs.pop(key, None)
    outputs["id"] = cid
    changes = diff(olds, news)
    if not preview and "mustRun" in changes and values.plain(news).get("mustRun", True):
        client.call("POST", f"/containers/{cid}/start")  # the same container, started again
    if not preview and ("restart" in changes or "maxRetryCount" in changes):
        p = values.plain(news)
        client.call("POST", f"/containers/{cid}/update", body={"RestartPolicy": {
            "Name": p.get("restart", "no"), "MaximumRetryCount": p.get("maxRetryCount", 0)}})
    return outputs


def delete(client: DockerHost, cid: str) -> None:
    remove(client, cid)
