"""`docker:index/container:Container`: the subset of pulumi-docker 5.2.0's Container the program may use.

Behaviour follows the upstream provider (kreuzwerker/terraform-provider-docker, bridged by pulumi-docker):
Create checks the image is on the node, creates, starts and waits up to 15 s for the container to run (it is
removed again if it exits); Read of a container that is not running while `mustRun` is true (the default)
removes it and reports it gone, so a refresh followed by an update recreates it; Delete force-removes.
"""

import re
import time

from providerkit import values
from providerkit.rpc import CheckFailures

from . import props
from .dockerapi import DockerError, DockerHost, demux_logs

TOKEN = "docker:index/container:Container"
LABEL = "Container"
RUN_WAIT_S = 15.0          # pulumi-docker's containerReadRefreshTimeout default
POLL_S = 0.1               # ... and its delay before the first look and between looks
LOG_TAIL_LINES = 20

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
    "shmSize": P(computed=True),
    "gpus": P(),
    "devices": P(is_set=True, fields=frozenset({"hostPath", "containerPath", "permissions"}),
                 required_fields=frozenset({"hostPath"})),
    "mounts": P(is_set=True, fields=frozenset({"target", "source", "type", "readOnly"}),
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
    return props.with_defaults(TABLE, news), failures


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
        "Init": False,
    }
    if "networkMode" in p:
        host["NetworkMode"] = p["networkMode"]
    if "ipcMode" in p:
        host["IpcMode"] = p["ipcMode"]
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
        host["CapAdd"] = p["capabilities"].get("adds") or None
        host["CapDrop"] = p["capabilities"].get("drops") or None
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
    return {k: v for k, v in read.items() if k not in given}


def last_logs(client: DockerHost, cid: str) -> str:
    raw = client.call("GET", f"/containers/{cid}/logs", query={"stdout": 1, "stderr": 1, "tail": LOG_TAIL_LINES})
    return demux_logs(raw if isinstance(raw, bytes) else b"").rstrip() or "(no output)"


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


def create(client: DockerHost, news: dict, cancelled) -> tuple[str, dict]:
    p = values.plain(news)
    if client.inspect("images", p["image"]) is None:
        raise RuntimeError(f"Unable to create container {p['name']!r} with image {p['image']!r}: the image is not "
                           f"present on {client.host}, and the docker test double never pulls")
    created = client.call("POST", "/containers/create", body=create_body(p), query={"name": p["name"]})
    cid = created["Id"]
    try:
        client.call("POST", f"/containers/{cid}/start")
        info = _wait_running(client, cid, p["name"], cancelled)
    except BaseException:
        remove(client, cid)
        raise
    outputs = dict(news)
    outputs.update(_computed_outputs(info, news))
    outputs["id"] = cid
    return cid, outputs


def _wait_running(client: DockerHost, cid: str, name: str, cancelled) -> dict:
    deadline = time.monotonic() + RUN_WAIT_S
    while True:
        time.sleep(POLL_S)
        info = client.inspect("containers", cid)
        if info is None:
            raise RuntimeError(f"container {name!r} ({cid[:12]}) on {client.host} vanished right after start")
        state = info["State"]
        if state["Running"]:
            return info
        if state["Status"] in ("exited", "dead"):
            raise RuntimeError(f"container {name!r} ({cid[:12]}) on {client.host} exited immediately "
                               f"(exit code {state['ExitCode']}); last log lines:\n{last_logs(client, cid)}")
        if time.monotonic() > deadline or cancelled.is_set():
            raise RuntimeError(f"container {name!r} ({cid[:12]}) on {client.host} failed to be in running state "
                               f"within {RUN_WAIT_S:.0f}s (status {state['Status']})")


def read(client: DockerHost, cid: str, state: dict, inputs: dict, note) -> tuple[str, dict, dict]:
    """(id, outputs, inputs); id "" means gone."""
    info = client.inspect("containers", cid)
    if info is None:
        return "", {}, {}
    p = values.plain(state)
    status = info["State"]
    if not status["Running"] and p.get("mustRun", True):
        remove(client, cid)
        note(f"container {p.get('name', cid)!r} ({cid[:12]}) on {client.host} was not running "
             f"(status {status['Status']}, exit code {status['ExitCode']}); mustRun is true, so it was removed "
             "and is reported gone, as pulumi-docker does")
        return "", {}, {}
    outputs = dict(state) if state else {"name": info["Name"].lstrip("/"), "image": info["Config"]["Image"]}
    outputs["id"] = cid
    new_inputs = dict(inputs) if inputs else {k: v for k, v in outputs.items() if k in TABLE}
    # The restart policy is the one property `docker update` can change behind Pulumi's back.
    policy = info["HostConfig"]["RestartPolicy"]
    live = {"restart": policy.get("Name") or "no", "maxRetryCount": policy.get("MaximumRetryCount", 0)}
    for key, value in live.items():
        if key == "restart" or value or key in outputs:
            outputs[key] = values.like(outputs.get(key), value)
            new_inputs[key] = values.like(new_inputs.get(key), value)
    outputs.pop("exitCode", None)
    if not status["Running"]:
        outputs["exitCode"] = status["ExitCode"]
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
    if not preview and ("restart" in changes or "maxRetryCount" in changes):
        p = values.plain(news)
        client.call("POST", f"/containers/{cid}/update", body={"RestartPolicy": {
            "Name": p.get("restart", "no"), "MaximumRetryCount": p.get("maxRetryCount", 0)}})
    return outputs


def delete(client: DockerHost, cid: str) -> None:
    remove(client, cid)
