"""Collects one node's facts for spark-vllm's preflight and prints them as one JSON object.

Runs on the node itself, as `python3 - SPEC` over SSH with this file on stdin, and needs only the standard
library. It judges nothing: components/preflight/judging.py compares the facts of every node. A fact that cannot be
gathered (a tool is missing, permission is denied) is reported as {"unavailable": why}, never guessed.
"""

import hashlib
import io
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from datetime import datetime, timezone

MARK = "SPARK_VLLM_PREFLIGHT "
# The packages vLLM's loaders import (model_loader/weight_utils.py, each behind a PlaceholderModule when missing).
LOADER_PACKAGES = ("fastsafetensors", "instanttensor", "runai_model_streamer", "tensorizer")
# Where an NCCL library came from: its version and its ELF build ID, which tells two builds of one version apart
# (vllm 41725: the image's pip NCCL and DGX OS's both say 2.28.9). Run on the node, and inside the image.
NCCL_FACTS = r"""
import mmap
import os
import struct


def build_id(path):  # the GNU build ID of a 64-bit ELF file, in hex; None when it has none
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _build_id(path, data)


def _build_id(path, data):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(path + " is not a 64-bit ELF file")
    order = "<" if data[5] == 1 else ">"
    phoff, = struct.unpack_from(order + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(order + "IIQQQQ", data, phoff + i * phentsize)
        at, end = p_offset, p_offset + p_filesz
        while p_type == 4 and at + 12 <= end:  # PT_NOTE: (namesz, descsz, type, name, desc), each 4-aligned
            namesz, descsz, kind = struct.unpack_from(order + "III", data, at)
            name_at = at + 12
            desc_at = name_at + (namesz + 3) // 4 * 4
            if kind == 3 and data[name_at:name_at + namesz] == b"GNU\0":  # NT_GNU_BUILD_ID
                return data[desc_at:desc_at + descsz].hex()
            at = desc_at + (descsz + 3) // 4 * 4
    return None


def nccl_facts(path, version):
    real = os.path.realpath(path)
    try:
        return {"path": path, "real": real, "version": version, "buildId": build_id(real),
                "size": os.path.getsize(real)}
    except (OSError, ValueError) as e:
        return {"path": path, "error": type(e).__name__ + ": " + str(e)}
"""
_NCCL: dict = {}
exec(NCCL_FACTS, _NCCL)
nccl_facts = _NCCL["nccl_facts"]
# Run inside the image: what `vllm serve` will import, and the architectures its registry knows.
INSIDE_IMAGE = NCCL_FACTS + """
import json
facts = {}
try:
    import ray
    facts["ray"] = ray.__version__
except Exception as e:
    facts["rayError"] = type(e).__name__ + ": " + str(e)
try:
    import vllm
    facts["vllm"] = vllm.__version__
    from vllm import ModelRegistry
    facts["archs"] = sorted(ModelRegistry.get_supported_archs())
except Exception as e:
    facts["vllmError"] = type(e).__name__ + ": " + str(e)
else:
    try:
        from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER
        facts["loadFormats"] = sorted(_LOAD_FORMAT_TO_MODEL_LOADER)
    except Exception as e:
        facts["loadFormatsError"] = type(e).__name__ + ": " + str(e)
# The loaders' packages: installed or not, then whether they import here (no GPU: some may need one to import).
import importlib
import importlib.util
packages = facts["loaderPackages"] = {}
for name in %(packages)r:
    if importlib.util.find_spec(name) is None:
        packages[name] = {"installed": False}
        continue
    try:
        packages[name] = {"installed": True, "version": str(getattr(importlib.import_module(name), "__version__", ""))}
    except Exception as e:
        packages[name] = {"installed": True, "error": type(e).__name__ + ": " + str(e)}
# The Hub download (serve.hub) runs in the image with its huggingface_hub.
try:
    import huggingface_hub
    facts["huggingfaceHub"] = huggingface_hub.__version__
except Exception:
    facts["huggingfaceHub"] = ""
# The NCCL that vLLM's pip packages bring (torch loads it from there): what nccl.hostLibrary would cover.
try:
    import importlib.metadata
    spec = importlib.util.find_spec("nvidia.nccl")
    lib = spec and next((os.path.join(d, "lib", "libnccl.so.2") for d in spec.submodule_search_locations
                         if os.path.exists(os.path.join(d, "lib", "libnccl.so.2"))), None)
    if lib:
        dist = next((d for d in importlib.metadata.distributions()
                     if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")), None)
        facts["nccl"] = nccl_facts(lib, dist.version if dist else None)
except Exception as e:
    facts["ncclError"] = type(e).__name__ + ": " + str(e)
# The mp executor across nodes needs a `vllm serve` that takes --nnodes. vLLM groups its help (--help=all lists
# every flag); an argparse without groups takes only --help.
import subprocess
for argv in (["vllm", "serve", "--help=all"], ["vllm", "serve", "--help"]):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=600)
    except Exception as e:
        facts["serveHelpError"] = type(e).__name__ + ": " + str(e)
        break
    if done.returncode == 0:
        facts["serveNnodes"] = "--nnodes" in done.stdout
        break
    facts["serveHelpError"] = (done.stdout.strip().splitlines() or ["exit " + str(done.returncode)])[-1]
print(%(mark)r + json.dumps(facts))
""" % {"mark": MARK, "packages": LOADER_PACKAGES}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
CACHE_DIR = os.path.expanduser("~/.cache/spark-vllm/preflight")
CONFIG_KEYS = ("architectures", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_size", "max_position_embeddings", "torch_dtype")
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


class Unavailable(Exception):
    """A fact that cannot be gathered here; the message says why."""


def error_line(text):
    """The line that says what went wrong: docker's own `docker: ...` line (a usage hint follows it), else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("docker: ")), lines[-1] if lines else "(no output)")


def sh(argv, timeout):
    """(returncode, stdout, stderr) of a bounded command; a missing tool or a hung one is Unavailable."""
    if shutil.which(argv[0]) is None:
        raise Unavailable(f"`{argv[0]}` is not installed")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"`{' '.join(argv[:3])}` gave no answer within {timeout:g} s") from None
    except PermissionError:
        raise Unavailable(f"permission denied running `{argv[0]}`") from None
    return done.returncode, done.stdout, done.stderr


def docker(spec):
    rc, out, err = sh(["docker", "version", "--format", "{{.Server.Version}}"], spec["stepTimeout"])
    if rc != 0:
        return {"error": error_line(err)}
    rc, info, err = sh(["docker", "info", "--format", "{{.Driver}} {{.DockerRootDir}}"], spec["stepTimeout"])
    driver, _, root = info.strip().partition(" ")
    return {"server": out.strip(), "driver": driver if rc == 0 else f"unknown ({error_line(err)})", "root": root}


def gpus(spec, image_present):
    if spec["gpuProbe"]:
        argv, source = ["sh", "-c", spec["gpuProbe"]], "gpuProbe"
    elif shutil.which("nvidia-smi"):
        argv, source = ["nvidia-smi", "-L"], "nvidia-smi"
    elif spec["dockerGpus"] and image_present:
        argv = ["docker", "run", "--rm", "--network", "none", "--gpus", spec["dockerGpus"], "--entrypoint",
                "nvidia-smi", spec["image"], "-L"]
        source = "runtime"
    else:
        raise Unavailable("`nvidia-smi` is not installed, and the NVIDIA runtime cannot be asked: " +
                          ("docker.gpus is none" if not spec["dockerGpus"] else "the image is not on the node"))
    rc, out, err = sh(argv, spec["stepTimeout"])
    if rc != 0:
        return {"source": source, "error": error_line(err or out)}
    names = [re.sub(r"\s*\(UUID:.*$", "", line.split(":", 1)[1]).strip()
             for line in out.splitlines() if re.match(r"\s*GPU \d+:", line)]
    return {"source": source, "names": names}


def fabric(spec):
    rc, out, err = sh(["ip", "-j", "addr", "show"], spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(f"`ip -j addr show` failed: {error_line(err)}")
    links = json.loads(out)
    addrs = {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                              if a.get("family") == "inet"] for link in links}
    link = next((link for link in links if link["ifname"] == spec["iface"]), None)
    facts = {"addrs": addrs, "exists": link is not None}
    if link is not None:
        facts.update(up="UP" in link.get("flags", []) and link.get("operstate") != "DOWN",
                     state=link.get("operstate", "UNKNOWN"), mtu=link.get("mtu"))
    routes = {}
    for name, ip in spec["peers"].items():
        rc, out, err = sh(["ip", "-j", "route", "get", ip], spec["stepTimeout"])
        if rc != 0:
            routes[name] = {"error": error_line(err)}
        else:
            route = json.loads(out)[0]
            routes[name] = {"dev": route.get("dev"), "src": route.get("prefsrc"), "via": route.get("gateway")}
    if facts.get("up") and facts.get("mtu"):
        with ThreadPoolExecutor(max_workers=max(1, len(spec["peers"]))) as pool:
            reached = dict(zip(spec["peers"], pool.map(lambda ip: reach(spec["iface"], ip, facts["mtu"]),
                                                       spec["peers"].values())))
        for name, found in reached.items():
            routes[name]["reach"] = found
    facts["routes"] = routes
    return facts


def reach(iface, ip, mtu):
    """Whether `ip` answers over `iface` alone: with a packet of the interface's whole MTU, fragmentation off (an
    ICMP echo of MTU - 28 bytes), and, when that fails, with a small one: a path whose MTU is smaller than the
    interface's, against a link that carries nothing."""
    def ping(*size):
        rc, _, err = sh(["ping", "-n", "-q", "-c", "1", "-W", "1", "-I", iface, *size, ip], 5)
        return rc == 0, error_line(err) if err.strip() else ""
    try:
        full, why = ping("-M", "do", "-s", str(mtu - 28))
        if full:
            return {"full": True}
        small, small_why = ping()
    except Unavailable as e:
        return {"unavailable": str(e)}
    return {"full": False, "small": small, "error": small_why or why}



def host_nccl(spec):
    """The host's own NCCL, as the dynamic linker's cache lists it (DGX OS's libnccl2 package), with its version from
    the file its link leads to (libnccl.so.2.28.9)."""
    # An SSH command's PATH often lacks /sbin, where ldconfig is.
    ldconfig = next((p for p in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig") if shutil.which(p)), "ldconfig")
    rc, out, err = sh([ldconfig, "-p"], spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(f"`ldconfig -p` failed: {error_line(err)}")
    path = next((line.split(" => ", 1)[1].strip() for line in out.splitlines()
                 if line.strip().startswith("libnccl.so.2 ") and " => " in line), None)
    if path is None:
        return {"missing": True}
    name = os.path.basename(os.path.realpath(path))
    return nccl_facts(path, name[len("libnccl.so."):] if name.startswith("libnccl.so.2.") else None)


def image(spec):
    rc, out, err = sh(["docker", "image", "inspect", "--format", "{{.Id}} {{.Size}}", spec["image"]],
                      spec["stepTimeout"])
    if rc != 0:
        if "no such image" in err.lower():
            return {"present": False}
        raise Unavailable(f"`docker image inspect` failed: {error_line(err)}")
    image_id, _, size = out.strip().partition(" ")
    facts = {"present": True, "id": image_id, "size": int(size) if size.isdigit() else None}
    if not spec.get("inside", True):  # the gateway's router: no vLLM to look for
        return facts
    # An image id names its contents, so what is inside is read once per id: importing vLLM takes a while.
    cache = os.path.join(CACHE_DIR, "inside5-" + facts["id"].replace("sha256:", "") + ".json")
    kept = cached(cache)
    if kept is not None:
        facts["inside"] = kept
        return facts
    rc, out, err = sh(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", spec["image"],
                       "-c", INSIDE_IMAGE], spec["imageTimeout"])
    found = [line[len(MARK):] for line in out.splitlines() if line.startswith(MARK)]
    if rc != 0 or not found:
        facts["inside"] = {"error": error_line(err or out)}  # not cached: the next run tries again
        return facts
    facts["inside"] = keep(cache, json.loads(found[-1]))
    return facts


def cached(path):
    """What keep() wrote at `path`, or None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def keep(path, value):
    """Writes `value` at `path` for later runs (whole or not at all), and returns it."""
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # a read-only home only costs the next run the same time
    return value


def _raise(error):
    raise error


def model(spec):
    """The weights folder: its files with their sizes (a link's target's), the links that lead nowhere, the folder
    that holds the weights and every place their links lead (what a container must mount), and the last Hub
    download's record."""
    root = spec["modelPath"]
    if not os.path.isdir(root):
        return {"exists": False, "isFile": os.path.exists(root)}
    files, dangling, reached, links = [], [], [root], 0
    for folder, dirs, names in os.walk(root, onerror=_raise):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(folder, name)
            if os.path.islink(path):
                links += 1
                hops = link_chain(path)
                reached += hops
                if not os.path.exists(path):
                    dangling.append([os.path.relpath(path, root), os.readlink(path)])
                    continue
            files.append([os.path.relpath(path, root), os.stat(path).st_size])
    files.sort()
    facts = {"exists": True, "files": files, "links": links, "dangling": sorted(dangling),
             "mountRoot": os.path.commonpath(reached)}
    record = read_record(spec.get("hubRecord"))
    if record is not None:
        facts["hub"] = record
    config_path = os.path.join(root, "config.json")
    if os.path.isfile(config_path):
        with open(config_path) as f:
            config = json.load(f)
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        # Multimodal checkpoints keep the language model's shape under text_config.
        facts["config"] = {k: config.get(k, text.get(k)) for k in CONFIG_KEYS if k in config or k in text}
    if spec["hashWeights"]:
        facts["sha256"] = {name: sha256(os.path.join(root, name)) for name, _ in files
                           if name.endswith(WEIGHT_SUFFIXES)}
    return facts


def link_chain(path):
    """Every place a link leads, hop by hop, spelled as a process sees them where the folder is mounted at the same
    path (relative links resolved from the link's folder, without resolving the folders' own links)."""
    hops = []
    for _ in range(40):  # the kernel's own limit on links followed
        if not os.path.islink(path):
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        hops.append(path)
    return hops


def read_record(path):
    """The Hub download's record beside the weights (components/remote/hub_download.py), or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        return {k: record[k] for k in ("repo", "revision", "commit", "files", "complete")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def space(spec, docker_root):
    """Free bytes where the weights go (the model path, or its nearest existing parent) and where Docker keeps its
    images (or the nearest folder this user may read)."""
    def free(path):
        while True:
            try:
                st = os.statvfs(path)
                return path, st.f_bavail * st.f_frsize
            except OSError:
                if path == "/":
                    raise
                path = os.path.dirname(path)
    facts = dict(zip(("weightsMount", "weightsFree"), free(spec["modelPath"])))
    if docker_root:
        facts.update(zip(("dockerRoot", "dockerFree"), free(docker_root)))
    return facts


# The disk's read: at most this much of the largest weight file, for at most this long, in these chunks.
READ_BYTES, READ_SECONDS, READ_CHUNK = 1 << 30, 2.0, 16 << 20


def disk(spec, weights):
    """The sequential read speed of the disk the weights are on: the largest weight file read with O_DIRECT (past the
    page cache, which is left as it is), bounded in bytes and time. Kept per boot and file, so a no-op preview reads
    nothing."""
    if not weights:
        raise Unavailable("no weight file to read")
    size, name = max((size, name) for name, size in weights)
    path = os.path.join(spec["modelPath"], name)
    st = os.stat(path)
    with open("/proc/sys/kernel/random/boot_id") as f:
        key = f"{f.read().strip()} {st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns}"
    cache = os.path.join(CACHE_DIR, "disk-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    kept = cached(cache)
    if kept is not None:
        return kept
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        raise Unavailable(f"{name} cannot be opened with O_DIRECT here ({e.strerror}), so a read would come from the "
                          "page cache") from None
    buf = mmap.mmap(-1, READ_CHUNK)  # page-aligned, as O_DIRECT needs
    done, start = 0, time.monotonic()
    try:
        while done < min(size, READ_BYTES) and time.monotonic() - start < READ_SECONDS:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
        buf.close()
    return keep(cache, {"file": name, "bytes": done, "seconds": max(time.monotonic() - start, 1e-6)})


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def memory(_spec):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return {"totalKib": int(line.split()[1])}
    raise Unavailable("/proc/meminfo has no MemTotal")


def claims(spec):
    """Every stack's share of this node's memory, from the volumes their deploys left (resources/memory_claim.py)."""
    labels = spec["claims"]
    rc, out, err = sh(["docker", "volume", "ls", "--filter", f"label={labels['fraction']}", "--format",
                       f'{{{{.Label "{labels["stack"]}"}}}}\t{{{{.Label "{labels["fraction"]}"}}}}'],
                      spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(f"`docker volume ls` failed: {error_line(err)}")
    found = {}
    for line in out.splitlines():
        stack, _, fraction = line.partition("\t")
        try:
            found[stack] = float(fraction)
        except ValueError:
            raise Unavailable(f"volume label {labels['fraction']}={fraction!r} of stack {stack!r} is not a "
                              "number") from None
    return {"byStack": found}


def ports(spec):
    rc, out, err = sh(["ss", "-H", "-t", "-l", "-n", "-p"], spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(f"`ss -tlnp` failed: {error_line(err)}")
    wanted = {int(p) for p in spec["ports"]}
    held: dict[int, dict[int, str]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[3]:
            continue
        port = int(fields[3].rsplit(":", 1)[1])
        if port in wanted:
            holders = held.setdefault(port, {})
            for comm, pid in re.findall(r'\("([^"]*)",pid=(\d+)', line):
                holders[int(pid)] = comm
    containers = _containers(spec) if held else {}
    facts: dict[str, dict] = {}
    for port in sorted(wanted):
        if port not in held:
            facts[str(port)] = {"free": True}
        elif not held[port]:
            # ss names a socket's owner only to root and to the owner; any user of the docker group can still
            # name the stacks whose containers run here.
            facts[str(port)] = {"free": False, "hidden": True, "running": sorted(
                (c for c in containers.values() if c["stack"]), key=lambda c: c["container"])}
        else:
            facts[str(port)] = {"free": False, "holders": [{"pid": pid, "process": comm, **_owner(pid, containers)}
                                                           for pid, comm in sorted(held[port].items())]}
    return facts


def _containers(spec):
    """Running containers by id; without Docker, holders are named by their cgroup's container id alone."""
    try:
        rc, out, _ = sh(["docker", "ps", "--no-trunc", "--format",
                         '{{.ID}}\t{{.Names}}\t{{.Label "spark-vllm.stack"}}'], spec["stepTimeout"])
    except Unavailable:
        return {}
    found = {}
    for line in out.splitlines() if rc == 0 else []:
        cid, name, stack = (line.split("\t") + ["", ""])[:3]
        found[cid] = {"container": name, "stack": stack}
    return found


def _owner(pid, containers):
    """The Docker container a process runs in, from its cgroup path (v1 and v2 both hold the id); {} for none."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            match = CONTAINER_ID.search(f.read())
    except OSError:
        return {"exiting": True}  # gone since `ss` listed it: a vLLM whose Ray worker died exits like this
    if not match:
        return {}
    return containers.get(match.group(0), {"container": match.group(0)[:12], "stack": ""})


def guard(spec):
    """This stack's fabric guard chains hooked into INPUT (components/remote/fabric_guard.sh list)."""
    g = spec["guard"]
    argv = ["sh", "-c", g["script"], "fabric-guard", "list", g["prefix"], g["label"]]
    if os.geteuid() != 0:
        argv = ["sudo", "-n", *argv]
    rc, out, err = sh(argv, spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(error_line(err or out))
    return {"hooked": out.split()}


def running(spec):
    """This stack's containers on the node as Docker has them, in any state; on the head, the serve too: whether it
    runs, and whether it answers one completion. What `preview` compares with what the state believes."""
    spec = {**spec["running"], "stepTimeout": spec["stepTimeout"]}
    rc, out, err = sh(["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label=spark-vllm.stack={spec['stack']}"],
                      spec["stepTimeout"])
    if rc != 0:
        raise Unavailable(f"`docker ps` failed: {error_line(err)}")
    containers = {}
    if out.split():
        rc, out, err = sh(["docker", "inspect", *out.split()], spec["stepTimeout"])
        if not out.strip().startswith("["):  # one removed since `docker ps` only fails its own entry
            raise Unavailable(f"`docker inspect` failed: {error_line(err)}")
        for c in json.loads(out):
            state, labels = c["State"], c["Config"].get("Labels") or {}
            containers[c["Name"].lstrip("/")] = {
                "running": state["Running"], "status": state["Status"], "exitCode": state["ExitCode"],
                "finishedAgo": _ago(state.get("FinishedAt")), "life": labels.get("spark-vllm.life"),
                "env": c["Config"].get("Env") or []}
    facts = {"containers": {name: {k: v for k, v in c.items() if k != "env"} for name, c in containers.items()}}
    key = None
    serve = spec.get("serve")
    if serve and containers.get(serve["container"], {}).get("running"):
        facts["serve"], key = _serve(spec, serve)
    rank0 = spec.get("rank0")
    if rank0 and containers.get(rank0, {}).get("running"):
        key = next((e.split("=", 1)[1] for e in containers[rank0]["env"] if e.startswith("VLLM_API_KEY=")), None)
    serving = facts.get("serve", {}).get("running") or (rank0 and containers.get(rank0, {}).get("running"))
    if spec.get("api") and serving:
        facts["api"] = _completion(spec["api"], key)
    keeper = spec.get("keeper")
    if keeper and keeper in containers:
        facts["keeper"] = _keeper_state(spec, keeper)
    return facts


def _ago(stamp):
    """Seconds since a Docker time (RFC 3339, nanoseconds), by this node's clock; None for Docker's zero time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    when = datetime.fromisoformat(re.sub(r"\.(\d{6})\d*", r".\1", stamp).replace("Z", "+00:00"))
    return round((datetime.now(timezone.utc) - when).total_seconds())


# In the Ray head: the serve's pid (serve_ctl.sh alive), then its life token, then the API key line of its env file.
SERVE_STATE = 'p=$(sh -c "$1" serve-ctl alive "$2") || exit 3; echo "$p"; cat "$3" 2>/dev/null; echo; ' \
              'grep "^VLLM_API_KEY=" "$4" 2>/dev/null; exit 0'


def _serve(spec, serve):
    """({"running", "life"}, the API key or None) of the serve in the Ray head container."""
    rc, out, err = sh(["docker", "exec", serve["container"], "sh", "-c", SERVE_STATE, "serve-state", serve["ctl"],
                       serve["pidFile"], serve["lifeFile"], serve["envFile"]], spec["stepTimeout"])
    if rc == 3:
        return {"running": False}, None
    if rc != 0:
        raise Unavailable(f"`docker exec {serve['container']}` failed: {error_line(err or out)}")
    lines = out.split("\n")
    key = next((line.split("=", 1)[1][1:-1].replace("'\\''", "'") for line in lines[2:]
                if line.startswith("VLLM_API_KEY=")), None)
    return {"running": True, "life": lines[1].strip() or None}, key


def _completion(api, key):
    """One real completion: {"answered": seconds}, or why not: refused (nothing listens yet: loading), failed or
    timeout."""
    body = json.dumps({"model": api["model"], "prompt": "ping", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"http://{api['host']}:{api['port']}/v1/completions", body, headers)
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=api["timeout"]) as r:
            json.load(r)
        return {"answered": round(time.monotonic() - start, 3)}
    except urllib.error.HTTPError as e:
        return {"failed": f"HTTP {e.code} {e.reason}", "status": e.code}
    except (OSError, ValueError) as e:  # urlopen wraps a refused connect in URLError; a read timeout is raw
        if "timed out" in str(e).lower():
            return {"timeout": api["timeout"]}
        reason = getattr(e, "reason", e)
        if isinstance(reason, ConnectionRefusedError):
            return {"refused": True}
        return {"failed": f"{type(reason).__name__}: {reason}"}


def _keeper_state(spec, keeper):
    """What the head's keeper last saved (components/remote/keeper.py): armed, for what, gave up, its phase. `docker
    cp` reads a stopped container's volume too, and needs no access to Docker's own folders."""
    try:
        done = subprocess.run(["docker", "cp", f"{keeper}:{spec['keeperState']}", "-"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=spec["stepTimeout"])
    except subprocess.TimeoutExpired:
        return {"unreadable": f"`docker cp` gave no answer within {spec['stepTimeout']} s"}
    if done.returncode != 0:
        return {"unreadable": error_line(done.stderr.decode(errors="replace"))}
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        member = tar.extractfile(tar.getmembers()[0])
        state = json.load(member) if member is not None else {}
    return {k: state.get(k) for k in ("armed", "token", "gave_up", "phase")}


TIMINGS: dict[str, float] = {}  # seconds per fact, reported so slow nodes show which step was slow


def gather(name, fn, *args):
    start = time.monotonic()
    try:
        facts = fn(*args)
    except Unavailable as e:
        facts = {"unavailable": str(e)}
    except PermissionError as e:
        facts = {"unavailable": f"permission denied on {e.filename}"}
    except (OSError, ValueError) as e:
        facts = {"unavailable": f"{type(e).__name__}: {e}"}
    TIMINGS[name] = round(time.monotonic() - start, 2)
    return facts


def gateway_facts(spec):
    """A gateway's node: Docker, the router's image (present or not), its port, and the gateway's container."""
    facts = {"docker": gather("docker", docker, spec)}
    if "server" in facts["docker"]:
        facts["image"] = gather("image", image, spec)
        facts["running"] = gather("running", running, spec)
    facts["ports"] = gather("ports", ports, spec)
    return facts


def node_facts(spec):
    """A model stack's node: everything its preflight judges."""
    facts = {"docker": gather("docker", docker, spec)}
    docker_ok = "server" in facts["docker"]
    if docker_ok:
        facts["image"] = gather("image", image, spec)
    facts["gpus"] = gather("gpus", gpus, spec, docker_ok and facts["image"].get("present", False))
    facts["fabric"] = gather("fabric", fabric, spec)
    facts["nccl"] = gather("nccl", host_nccl, spec)
    facts["model"] = gather("model", model, spec)
    if facts["model"].get("exists"):
        weights = [f for f in facts["model"]["files"] if f[0].endswith(WEIGHT_SUFFIXES)]
        facts["disk"] = gather("disk", disk, spec, weights)
    if spec.get("syncWeights"):
        facts["rsync"] = shutil.which("rsync") is not None  # what preflight.syncWeights copies with
    facts["memory"] = gather("memory", memory, spec)
    if spec["ports"]:
        facts["ports"] = gather("ports", ports, spec)
    if spec["guard"]:
        facts["guard"] = gather("guard", guard, spec)
    if docker_ok:
        facts["running"] = gather("running", running, spec)
        facts["claims"] = gather("claims", claims, spec)
    facts["space"] = gather("space", space, spec, facts["docker"].get("root", ""))
    return facts


def main():
    spec = json.loads(sys.argv[1])
    facts = gateway_facts(spec) if spec.get("gateway") else node_facts(spec)
    facts["timings"] = TIMINGS
    print(MARK + json.dumps(facts))


if __name__ == "__main__":
    main()
