"""What preflight's probe found on one node, typed. components/remote/preflight_probe.py prints it as JSON.

A group of facts that could not be gathered holds only `unavailable`: why not. A group that was not asked for (the
ports on a worker, the guard without ray.fabricGuard) or could not be asked (the image while Docker does not answer)
is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Optional


@dataclass(frozen=True)
class Docker:
    server: str = ""  # the daemon's version
    driver: str = ""  # its storage driver
    root: str = ""  # where it keeps images (DockerRootDir)
    error: Optional[str] = None  # why the daemon does not answer
    unavailable: Optional[str] = None  # why it could not be asked (no `docker`)


@dataclass(frozen=True)
class LoaderPackage:
    """A package one of vLLM's loaders imports, as found in the image."""
    installed: bool
    version: str = ""
    error: Optional[str] = None  # why it did not import, installed (started without a GPU)


@dataclass(frozen=True)
class Nccl:
    """An NCCL library (libnccl.so.2): the host's, or the one vLLM's pip packages put in the image."""
    path: str = ""  # where it is found: the linker's cache's entry, or the pip package's lib/libnccl.so.2
    real: str = ""  # the file that path leads to: what a mount of it shows
    version: Optional[str] = None  # from the file's name (host) or the pip package (image); None: not known
    build_id: Optional[str] = None  # the ELF build ID: two builds of one version differ here
    size: Optional[int] = None
    missing: bool = False  # the host has none
    error: Optional[str] = None  # why it could not be read
    unavailable: Optional[str] = None

    def describe(self) -> str:
        build = f"build {self.build_id[:12]}" if self.build_id else "no build ID"
        return f"{self.version or 'version unknown'} ({build}, {self.real or self.path})"


@dataclass(frozen=True)
class InsideImage:
    """What the image holds, read by starting it."""
    ray: str = ""
    vllm: str = ""
    archs: Optional[tuple[str, ...]] = None  # the architectures of vLLM's model registry; None: not read
    error: Optional[str] = None  # why python3 did not run in the image
    ray_error: Optional[str] = None  # why `import ray` failed
    vllm_error: Optional[str] = None  # why `import vllm` failed
    serve_nnodes: Optional[bool] = None  # `vllm serve` takes --nnodes (mp across nodes); None: its help did not run
    serve_help_error: Optional[str] = None  # why `vllm serve --help` did not run
    load_formats: Optional[tuple[str, ...]] = None  # the formats of vLLM's loader registry; None: not read
    load_formats_error: Optional[str] = None  # why the registry could not be read
    loader_packages: Mapping[str, LoaderPackage] = field(default_factory=dict)  # package -> what was found
    huggingface_hub: Optional[str] = None  # its version, "" when the image has none; None: not read
    nccl: Optional[Nccl] = None  # the pip packages' NCCL; None: the image has none (or it was not read)
    nccl_error: Optional[str] = None  # why it could not be looked for


@dataclass(frozen=True)
class Image:
    present: bool = False
    id: str = ""
    size: Optional[int] = None  # bytes, as `docker image inspect` counts them
    inside: Optional[InsideImage] = None  # None when the image is not on the node
    unavailable: Optional[str] = None


class GpuSource(Enum):
    NVIDIA_SMI = "nvidia-smi"
    GPU_PROBE = "gpuProbe"  # the cluster catalog's stand-in command (the lab)
    RUNTIME = "runtime"  # nvidia-smi through the NVIDIA container runtime


@dataclass(frozen=True)
class Gpus:
    source: Optional[GpuSource] = None
    names: tuple[str, ...] = ()
    error: Optional[str] = None  # what the source said when it failed
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Reach:
    """A ping of a peer's fabric IP bound to the fabric interface: of the interface's MTU unfragmented, then small."""
    full: bool = False  # a packet of the whole MTU passed, fragmentation off
    small: Optional[bool] = None  # when it did not: whether a small one did
    error: str = ""  # what ping said
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Route:
    """How this node reaches a peer's fabric IP (`ip route get`), and whether it answers there."""
    dev: str = ""
    src: str = ""
    via: Optional[str] = None
    error: Optional[str] = None  # no route
    reach: Optional[Reach] = None  # None: not tried (the interface is down or has no MTU)


@dataclass(frozen=True)
class Fabric:
    exists: bool = False  # the cluster's fabric interface is on the node
    up: bool = False
    state: str = ""  # its operstate
    mtu: Optional[int] = None
    addrs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # every interface -> its IPv4 CIDRs
    routes: Mapping[str, Route] = field(default_factory=dict)  # peer node name -> the route to it
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class HubRecord:
    """What the last Hub download on this node recorded beside the weights (components/remote/hub_download.py)."""
    repo: str
    revision: str  # as the stack wrote it
    commit: str  # what it resolved to
    files: tuple[tuple[str, int, str], ...]  # every file of the repo at that commit: (path, size, etag)
    complete: bool  # every file it fetched arrived


@dataclass(frozen=True)
class Model:
    exists: bool = False  # the model path is a folder
    is_file: bool = False  # the model path is a file
    files: tuple[tuple[str, int], ...] = ()  # (path in the folder, size in bytes: a link's target's), sorted
    config: Optional[Mapping[str, Any]] = None  # what preflight reads of config.json; None without one
    sha256: Mapping[str, str] = field(default_factory=dict)  # weight file -> its SHA-256, with hashWeights
    links: int = 0  # how many of the files are symbolic links (a Hugging Face cache snapshot's are)
    dangling: tuple[tuple[str, str], ...] = ()  # (path, where it points) of each link to nothing
    mount_root: Optional[str] = None  # the folder that holds the weights and whatever their links point to
    hub: Optional[HubRecord] = None  # the last Hub download's record, on the node that downloads
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Space:
    """Free disk space where the weights go, and where Docker keeps its images."""
    weights_free: Optional[int] = None  # bytes free on the file system of the model path (or its nearest parent)
    weights_mount: str = ""  # that existing folder
    docker_free: Optional[int] = None  # bytes free where Docker keeps images; None: not readable here
    docker_root: str = ""
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Memory:
    total_kib: int = 0  # MemTotal
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Claims:
    """Every deployed stack's gpuMemoryUtilization on the node, this one's included (resources/memory_claim.py)."""
    by_stack: Mapping[str, float] = field(default_factory=dict)
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class PortHolder:
    pid: int
    process: str
    container: str = ""  # the Docker container the process runs in
    stack: str = ""  # that container's spark-vllm stack label
    exiting: bool = False  # gone since `ss` listed it


@dataclass(frozen=True)
class StackContainer:
    container: str
    stack: str  # its spark-vllm stack label


@dataclass(frozen=True)
class Port:
    free: bool
    hidden: bool = False  # in use, but `ss` names its owner only to root
    holders: tuple[PortHolder, ...] = ()
    running: tuple[StackContainer, ...] = ()  # when hidden: the spark-vllm containers running on the node


@dataclass(frozen=True)
class Ports:
    by_port: Mapping[int, Port] = field(default_factory=dict)
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Guard:
    hooked: tuple[str, ...] = ()  # this stack's chains hooked into INPUT
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class ContainerState:
    """One of this stack's containers on the node, as Docker has it."""
    running: bool
    status: str  # Docker's word: running, exited, created, ...
    exit_code: int = 0
    finished_ago_s: Optional[int] = None  # seconds since it stopped, by the node's clock
    life: Optional[str] = None  # its `spark-vllm.life` label (components/preflight/liveness.py)


@dataclass(frozen=True)
class Api:
    """One completion asked of the API on the head."""
    answered_s: Optional[float] = None  # it answered, in this time
    refused: bool = False  # nothing listens yet: the serve is loading
    failed: Optional[str] = None  # the HTTP error or the connection's
    status: Optional[int] = None  # the HTTP status of a failed answer
    timeout_s: Optional[float] = None  # no answer within this bound: a wedged engine


@dataclass(frozen=True)
class KeeperState:
    """What the head's keeper last saved."""
    armed: bool = False
    token: Optional[str] = None  # what it was armed for
    gave_up: Optional[str] = None  # "gave up after N restarts: <reason>"
    phase: Optional[str] = None
    unreadable: Optional[str] = None  # why its state could not be read


@dataclass(frozen=True)
class Running:
    """What of this stack runs on the node: its containers by name; on the head, the serve and the API."""
    containers: Mapping[str, ContainerState] = field(default_factory=dict)
    serve_running: Optional[bool] = None  # Ray: `vllm serve` lives in the head container; None: not asked
    serve_life: Optional[str] = None  # the life token kept beside it
    api: Optional[Api] = None  # None: not asked (nothing that serves runs)
    keeper: Optional[KeeperState] = None  # None: no keeper here
    unavailable: Optional[str] = None


@dataclass(frozen=True)
class Disk:
    """The weights' disk read past the page cache: how many bytes of which weight file, in how long."""
    file: str = ""
    bytes: int = 0
    seconds: float = 0.0
    unavailable: Optional[str] = None

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class NodeFacts:
    ssh_error: Optional[str] = None  # SSH failed, so nothing was gathered
    probe_error: Optional[str] = None  # the probe did not run, so nothing was gathered
    seconds: float = 0.0  # how long the probe took, SSH included
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds per group of facts
    docker: Docker = Docker()
    image: Optional[Image] = None
    gpus: Gpus = Gpus()
    fabric: Fabric = Fabric()
    nccl: Optional[Nccl] = None  # the host's own NCCL library
    model: Optional[Model] = None
    disk: Optional[Disk] = None  # None when the weights are not there
    memory: Memory = Memory()
    ports: Optional[Ports] = None
    guard: Optional[Guard] = None
    rsync: Optional[bool] = None  # whether rsync is installed, with preflight.syncWeights
    running: Optional[Running] = None  # None when Docker does not answer
    claims: Optional[Claims] = None  # None when Docker does not answer
    space: Optional[Space] = None

    @property
    def reachable(self) -> bool:
        return self.ssh_error is None and self.probe_error is None


def parse(raw: Mapping[str, Any]) -> NodeFacts:
    """The facts from the probe's JSON, with `seconds`; or `sshError` or `probeError` (preflight/probing.py)."""
    def group(key: str, cls: type, make: Callable[[Mapping[str, Any]], Any]) -> Any:
        value = raw.get(key)
        if value is None:
            return None
        return cls(unavailable=value["unavailable"]) if "unavailable" in value else make(value)

    return NodeFacts(
        ssh_error=raw.get("sshError"), probe_error=raw.get("probeError"), seconds=raw.get("seconds", 0.0),
        timings=raw.get("timings", {}),
        docker=group("docker", Docker, _docker) or Docker(),
        image=group("image", Image, _image),
        gpus=group("gpus", Gpus, _gpus) or Gpus(),
        fabric=group("fabric", Fabric, _fabric) or Fabric(),
        nccl=group("nccl", Nccl, _nccl),
        model=group("model", Model, _model),
        disk=group("disk", Disk, lambda value: Disk(file=value["file"], bytes=value["bytes"],
                                                    seconds=value["seconds"])),
        memory=group("memory", Memory, lambda value: Memory(total_kib=value["totalKib"])) or Memory(),
        ports=group("ports", Ports, _ports),
        guard=group("guard", Guard, lambda value: Guard(hooked=tuple(value["hooked"]))),
        rsync=raw.get("rsync"),
        running=group("running", Running, _running),
        claims=group("claims", Claims, lambda value: Claims(by_stack=dict(value["byStack"]))),
        space=group("space", Space, lambda value: Space(
            weights_free=value.get("weightsFree"), weights_mount=value.get("weightsMount", ""),
            docker_free=value.get("dockerFree"), docker_root=value.get("dockerRoot", ""))))


def _docker(value: Mapping[str, Any]) -> Docker:
    return Docker(server=value.get("server", ""), driver=value.get("driver", ""), root=value.get("root", ""),
                  error=value.get("error"))


def _image(value: Mapping[str, Any]) -> Image:
    inside = value.get("inside")
    if inside is None:
        return Image(present=value["present"], id=value.get("id", ""), size=value.get("size"))
    archs = tuple(inside["archs"]) if "archs" in inside else None
    return Image(present=value["present"], id=value.get("id", ""), size=value.get("size"), inside=InsideImage(
        ray=inside.get("ray", ""), vllm=inside.get("vllm", ""), archs=archs, error=inside.get("error"),
        ray_error=inside.get("rayError"), vllm_error=inside.get("vllmError"), serve_nnodes=inside.get("serveNnodes"),
        serve_help_error=inside.get("serveHelpError"),
        load_formats=tuple(inside["loadFormats"]) if "loadFormats" in inside else None,
        load_formats_error=inside.get("loadFormatsError"),
        loader_packages={name: LoaderPackage(installed=found["installed"], version=found.get("version", ""),
                                             error=found.get("error"))
                         for name, found in inside.get("loaderPackages", {}).items()},
        huggingface_hub=inside.get("huggingfaceHub"),
        nccl=_nccl(inside["nccl"]) if "nccl" in inside else None, nccl_error=inside.get("ncclError")))


def _nccl(value: Mapping[str, Any]) -> Nccl:
    return Nccl(path=value.get("path", ""), real=value.get("real", ""), version=value.get("version"),
                build_id=value.get("buildId"), size=value.get("size"), missing=value.get("missing", False),
                error=value.get("error"))


def _gpus(value: Mapping[str, Any]) -> Gpus:
    return Gpus(source=GpuSource(value["source"]), names=tuple(value.get("names", ())), error=value.get("error"))


def _fabric(value: Mapping[str, Any]) -> Fabric:
    routes = {peer: Route(dev=route.get("dev") or "", src=route.get("src") or "", via=route.get("via"),
                          error=route.get("error"), reach=_reach(route["reach"]) if "reach" in route else None)
              for peer, route in value.get("routes", {}).items()}
    return Fabric(exists=value["exists"], up=value.get("up", False), state=value.get("state", ""),
                  mtu=value.get("mtu"), addrs={name: tuple(cidrs) for name, cidrs in value.get("addrs", {}).items()},
                  routes=routes)


def _reach(value: Mapping[str, Any]) -> Reach:
    if "unavailable" in value:
        return Reach(unavailable=value["unavailable"])
    return Reach(full=value["full"], small=value.get("small"), error=value.get("error", ""))


def _model(value: Mapping[str, Any]) -> Model:
    hub = value.get("hub")
    return Model(exists=value["exists"], is_file=value.get("isFile", False),
                 files=tuple((name, size) for name, size in value.get("files", ())), config=value.get("config"),
                 sha256=value.get("sha256", {}), links=value.get("links", 0),
                 dangling=tuple((name, target) for name, target in value.get("dangling", ())),
                 mount_root=value.get("mountRoot"),
                 hub=HubRecord(repo=hub["repo"], revision=hub["revision"], commit=hub["commit"],
                               files=tuple((p, n, e) for p, n, e in hub["files"]), complete=hub["complete"])
                 if isinstance(hub, dict) else None)


def _ports(value: Mapping[str, Any]) -> Ports:
    return Ports(by_port={int(port): Port(free=state["free"], hidden=state.get("hidden", False), holders=tuple(
        PortHolder(pid=holder["pid"], process=holder.get("process", ""), container=holder.get("container", ""),
                   stack=holder.get("stack", ""), exiting=holder.get("exiting", False))
        for holder in state.get("holders", ())), running=tuple(
        StackContainer(container=c["container"], stack=c["stack"]) for c in state.get("running", ())))
        for port, state in value.items()})


def _running(value: Mapping[str, Any]) -> Running:
    serve, api, keeper = value.get("serve"), value.get("api"), value.get("keeper")
    return Running(
        containers={name: ContainerState(running=c["running"], status=c["status"],
                                         exit_code=c.get("exitCode", 0), finished_ago_s=c.get("finishedAgo"),
                                         life=c.get("life")) for name, c in value.get("containers", {}).items()},
        serve_running=serve["running"] if serve else None, serve_life=serve.get("life") if serve else None,
        api=Api(answered_s=api.get("answered"), refused=api.get("refused", False), failed=api.get("failed"),
                status=api.get("status"), timeout_s=api.get("timeout")) if api else None,
        keeper=KeeperState(armed=bool(keeper.get("armed")), token=keeper.get("token"), gave_up=keeper.get("gave_up"),
                           phase=keeper.get("phase"), unreadable=keeper.get("unreadable")) if keeper else None)
