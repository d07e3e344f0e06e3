"""The lab's images: the node image (an emulated Spark), the inner Ray + vLLM-double image, the inner
vLLM-double image without Ray (as NGC vLLM images from 26.04 on), for the `mp` executor, and the gateway's
router, HAProxy from Debian (docs/gateway.md).

All start from a cached debootstrap tarball (the inner ones from a second cached tarball that adds the
Ray venv; the Ray-less one uninstalls Ray from it), and are reused while the hash of their inputs (the
"stamp") is unchanged: the node image by tag, the inner images (whose tags are fixed) by a label.
"""
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import model
from .config import (CACHE_DIR, GATEWAY_IMAGE, GATEWAY_PACKAGES, HOST_CA_BUNDLE, HUGGINGFACE_HUB, INNER_IMAGE, LAB_SRC,
                     MP_IMAGE, NODE_IMAGE_REPO, RAY_VERSION, SPEC_LABEL, VLLM_DOUBLE_DIR, Node)
from .rootfs import base_tarball, chroot_sh, docker_import, hash_inputs, pack, unpacked
from .run import LabError, log, out, run

NODE_PACKAGES = ["openssh-server", "docker.io", "python3", "iproute2", "procps", "ca-certificates", "rsync",
                 "curl", "iputils-ping"]
INNER_PACKAGES = ["python3", "python3-venv", "curl", "procps", "iproute2", "ca-certificates"]
# Bookworm's venv setuptools cannot build wheels on its own; this one lets the double install offline.
SETUPTOOLS_VERSION = "84.2.1"
NODE_FILES = LAB_SRC / "node"
BUILDERS = [Path(__file__), LAB_SRC / "labkit/rootfs.py"]
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Stand-ins for the two NCCL libraries of a Spark (docs/host-nccl.md): one version, two builds of
# lab/nccl_stand_in/libnccl.c, the host's in the node image (where DGX OS's libnccl2 puts it, in the linker's cache),
# the image's where vLLM's pip packages put theirs (nvidia-nccl-cu12).
NCCL_SOURCE = LAB_SRC / "nccl_stand_in" / "libnccl.c"
NCCL_VERSION = "2.28.9"
NCCL_LIB = "/run/svl-build/libnccl.so.2"  # where the build's stand-in is bound while the chroot runs
HOST_NCCL = f"""
    lib=$(dirname "$(readlink -f /usr/lib/*/libz.so.1)")
    cp {NCCL_LIB} "$lib/libnccl.so.{NCCL_VERSION}"
    ln -sf "libnccl.so.{NCCL_VERSION}" "$lib/libnccl.so.2"
    ldconfig
    ldconfig -p | grep -q 'libnccl.so.2 '
    """
PIP_NCCL = f"""
    site=$(echo /opt/venv/lib/python3*/site-packages)
    mkdir -p "$site/nvidia/nccl/lib" "$site/nvidia_nccl_cu12-{NCCL_VERSION}.dist-info"
    touch "$site/nvidia/__init__.py" "$site/nvidia/nccl/__init__.py"
    cp {NCCL_LIB} "$site/nvidia/nccl/lib/libnccl.so.2"
    printf 'Metadata-Version: 2.1\\nName: nvidia-nccl-cu12\\nVersion: {NCCL_VERSION}\\n' \\
        > "$site/nvidia_nccl_cu12-{NCCL_VERSION}.dist-info/METADATA"
    """


def nccl_stand_in(which: str) -> Path:
    """lab/nccl_stand_in/libnccl.c built as `which` ("host" or "pip"): a real shared library, soname libnccl.so.2,
    whose build ID differs with `which`."""
    out = CACHE_DIR / f"libnccl-{which}-{hash_inputs(NCCL_SOURCE)}.so"
    if not out.exists():
        run(["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libnccl.so.2", "-Wl,--build-id",
             f'-DSTAND_IN="{which}"', "-o", str(out), str(NCCL_SOURCE)], timeout=120)
    return out


def image_id(ref: str, where: list[str] = ()) -> str | None:
    proc = run([*where, "docker", "image", "inspect", "-f", "{{.Id}}", ref], check=False, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_node_image() -> str:
    stamp = hash_inputs(json.dumps(NODE_PACKAGES), NODE_FILES, LAB_SRC / "labkit/model.py", NCCL_SOURCE, *BUILDERS)
    tag = f"{NODE_IMAGE_REPO}:{stamp}"
    if image_id(tag):
        log(f"node image up to date: {tag}")
        return tag
    base = base_tarball(NODE_PACKAGES)
    with unpacked(base, "node-rootfs") as root:
        shutil.copy(NODE_FILES / "svl-node-init", root / "usr/local/sbin/svl-node-init")
        shutil.copy(NODE_FILES / "sshd_config", root / "etc/ssh/sshd_config.d/svl-lab.conf")
        (root / "etc/docker").mkdir(exist_ok=True)
        shutil.copy(NODE_FILES / "daemon.json", root / "etc/docker/daemon.json")
        (root / "root/.cache/huggingface").mkdir(parents=True)
        models, manifest = root / model.MODELS_DIR.lstrip("/"), root / model.MANIFEST.lstrip("/")
        model.write_models(models)
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(model.format_manifest(model.manifest(models)))
        chroot_sh(root, HOST_NCCL, binds={nccl_stand_in("host"): NCCL_LIB}, env={}, timeout=60,
                  logfile=CACHE_DIR / "node-nccl.log")
        shutil.rmtree(root / "run/svl-build")
        docker_import(root, tag, [
            'ENTRYPOINT ["/usr/local/sbin/svl-node-init"]',
            f"ENV PATH={STD_PATH}",
            f"LABEL {SPEC_LABEL}={stamp}",
        ])
    for old in out(["docker", "images", NODE_IMAGE_REPO, "--format", "{{.Tag}}"]).split():
        if old != stamp:  # superseded builds; one still used by a container stays
            run(["docker", "rmi", f"{NODE_IMAGE_REPO}:{old}"], check=False)
    log(f"built {tag}")
    return tag


def _pip_into_venv(root: Path, packages: list[str], logfile: Path) -> None:
    """A venv at /opt/venv in the chroot, with packages from PyPI."""
    log(f"pip install {' '.join(packages)} in a chroot (log: {logfile})")
    chroot_sh(root, """
        python3 -m venv /opt/venv
        /opt/venv/bin/pip install --no-input --progress-bar off """ + " ".join(f'"{p}"' for p in packages) + """
        """,
        # The CA bundle of the host's TLS-intercepting proxy exists only while pip runs.
        binds={HOST_CA_BUNDLE: "/run/svl-build/ca.crt"},
        env={"PIP_CERT": "/run/svl-build/ca.crt", "PIP_NO_CACHE_DIR": "1",
             "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180"},
        timeout=1800, logfile=logfile)
    shutil.rmtree(root / "run/svl-build")


def _ray_rootfs() -> Path:
    """Debian + a venv with ray[default] and huggingface_hub (which vLLM images carry) from PyPI, cached as a tarball
    (the slow, rarely changing part)."""
    key = hash_inputs(json.dumps(INNER_PACKAGES), RAY_VERSION, SETUPTOOLS_VERSION, HUGGINGFACE_HUB, *BUILDERS)
    tarball = CACHE_DIR / f"ray-rootfs-{key}.tar"
    if tarball.exists():
        log(f"ray rootfs cache hit: {tarball.name}")
        return tarball
    with unpacked(base_tarball(INNER_PACKAGES), "ray-rootfs") as root:
        _pip_into_venv(root, [f"ray[default]=={RAY_VERSION}", f"setuptools=={SETUPTOOLS_VERSION}", HUGGINGFACE_HUB],
                       CACHE_DIR / "ray-rootfs-build.log")
        pack(root, tarball)
    for old in CACHE_DIR.glob("ray-rootfs-*.tar"):
        if old != tarball:
            old.unlink()
    return tarball


def ensure_gateway_image() -> str:
    """Build the gateway's HAProxy image on the host unless its label already carries the current stamp."""
    stamp = hash_inputs(json.dumps(GATEWAY_PACKAGES), *BUILDERS)
    if _stamped(GATEWAY_IMAGE, stamp):
        log(f"gateway image up to date: {GATEWAY_IMAGE}")
        return image_id(GATEWAY_IMAGE)
    with unpacked(base_tarball(GATEWAY_PACKAGES), "gateway-rootfs") as root:
        chroot_sh(root, "haproxy -v", binds={}, env={}, timeout=60, logfile=CACHE_DIR / "gateway-check.log")
        new_id = docker_import(root, GATEWAY_IMAGE, [f"ENV PATH={STD_PATH}",
                                                     f"LABEL {SPEC_LABEL}={stamp}"])
    run(["docker", "image", "prune", "-f", "--filter", f"label={SPEC_LABEL}"], check=False)
    log(f"built {GATEWAY_IMAGE} {new_id[:19]}")
    return new_id


def _stamped(ref: str, stamp: str) -> bool:
    """Whether the host's image `ref` was built from inputs with this hash (its label says so)."""
    return run(["docker", "image", "inspect", "-f", f'{{{{index .Config.Labels "{SPEC_LABEL}"}}}}', ref],
               check=False, timeout=60).stdout.strip() == stamp


def _import_venv_image(root: Path, ref: str, stamp: str, *env: str) -> str:
    """The rootfs as image `ref`, its venv on PATH, stamped; the builds it supersedes pruned."""
    new_id = docker_import(root, ref, [
        f"ENV PATH=/opt/venv/bin:{STD_PATH}",
        "ENV VIRTUAL_ENV=/opt/venv",
        *(f"ENV {e}" for e in env),
        'CMD ["/bin/bash"]',
        f"LABEL {SPEC_LABEL}={stamp}",
    ])
    run(["docker", "image", "prune", "-f", "--filter", f"label={SPEC_LABEL}"], check=False)
    log(f"built {ref} {new_id[:19]}")
    return new_id


# What the inner images run once the double is installed; the Ray-less one proves Ray is gone.
_WITH_RAY = """
    ln -sf /opt/venv/bin/ray /usr/local/bin/ray
    ray --version
    """
_WITHOUT_RAY = """
    /opt/venv/bin/pip uninstall --yes ray
    if /opt/venv/bin/python -c 'import ray' 2>/dev/null; then echo 'ray is still importable' >&2; exit 1; fi
    rm -f /opt/venv/bin/ray /usr/local/bin/ray
    """


def ensure_inner_image() -> str:
    """Build spark-vllm-lab/ray-vllm on the host unless its label already carries the current stamp."""
    return _double_image(INNER_IMAGE, _WITH_RAY, "inner", ("fastsafetensors", "instanttensor"))


def ensure_mp_image() -> str:
    """Build spark-vllm-lab/vllm-mp (the double, no Ray) unless its label already carries the current stamp. It has
    no `instanttensor`, so that the lab can show preflight refusing that load format on an image that lacks it."""
    return _double_image(MP_IMAGE, _WITHOUT_RAY, "mp", ("fastsafetensors",))


def _double_image(ref: str, setup: str, what: str, loader_packages: tuple[str, ...]) -> str:
    if not any((VLLM_DOUBLE_DIR / f).exists() for f in ("pyproject.toml", "setup.py")):
        raise LabError(f"{VLLM_DOUBLE_DIR} holds no Python project (pyproject.toml); the {what} image needs it")
    ray_rootfs = _ray_rootfs()
    stamp = hash_inputs(ray_rootfs.name, setup, VLLM_DOUBLE_DIR, *loader_packages, NCCL_SOURCE, *BUILDERS)
    if _stamped(ref, stamp):
        log(f"{what} image up to date: {ref}")
        return image_id(ref)
    logfile = CACHE_DIR / f"{what}-build.log"
    with unpacked(ray_rootfs, f"{what}-rootfs") as root:
        shutil.copytree(VLLM_DOUBLE_DIR, root / "tmp/vllm_double",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", ".pytest_cache"))
        log(f"pip install lab/vllm_double offline in a chroot (log: {logfile})")
        # Offline against the venv's own setuptools: the double needs nothing from PyPI beyond Ray.
        chroot_sh(root, """
            /opt/venv/bin/pip install --no-input --no-index --no-build-isolation /tmp/vllm_double
            for package in """ + " ".join(loader_packages) + """; do
                cp -r "/tmp/vllm_double/loader_packages/$package" /opt/venv/lib/python3*/site-packages/
            done
            rm -rf /tmp/vllm_double
            ln -sf /opt/venv/bin/vllm /usr/local/bin/vllm
            """ + PIP_NCCL + setup + """
            vllm --help >/dev/null
            /opt/venv/bin/python -c 'import vllm; print("vllm", vllm.__version__)'
            """, binds={nccl_stand_in("pip"): NCCL_LIB}, env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=600,
            logfile=logfile)
        shutil.rmtree(root / "run/svl-build")
        # Ray's usage stats look up usage-stats.ray.io and cloud metadata hosts: no lab traffic leaves the host.
        return _import_venv_image(root, ref, stamp, "RAY_USAGE_STATS_ENABLED=0")


def load_into_nodes(wanted_id: str, nodes: list[Node], ref: str = INNER_IMAGE, what: str = "inner") -> None:
    """Give every node the host's exact image (same id) via one cached `docker save` tarball.

    Streaming the file into `docker exec -i NODE docker load` beat `docker save | ssh NODE docker load`
    (no ssh cipher, no jump hop for node2..N); see lab/README.md for the numbers.
    """
    missing = [n for n in nodes if image_id(ref, ["docker", "exec", n.name]) != wanted_id]
    for n in nodes:
        if n not in missing:
            log(f"{n.name}: {what} image already {wanted_id[7:19]}")
    if not missing:
        return
    tarball = CACHE_DIR / f"{what}-{wanted_id[7:19]}.tar"
    if not tarball.exists():
        for old in CACHE_DIR.glob(f"{what}-*.tar"):
            old.unlink()
        partial = tarball.with_suffix(".partial")
        run(["docker", "save", "-o", str(partial), ref], timeout=900)
        partial.rename(tarball)

    def load(node: Node) -> None:
        with open(tarball, "rb") as f:
            run(["docker", "exec", "-i", node.name, "docker", "load"], stdin=f, timeout=900)
        got = image_id(ref, ["docker", "exec", node.name])
        if got != wanted_id:
            raise LabError(f"{node.name}: loaded {ref} has id {got}, host has {wanted_id}")
        # The previous build under the same tag is now dangling; it only takes space in the node's volume.
        run(["docker", "exec", node.name, "docker", "image", "prune", "-f"], check=False, timeout=120)
        log(f"{node.name}: loaded {what} image {wanted_id[7:19]}")

    with ThreadPoolExecutor(len(missing)) as pool:
        list(pool.map(load, missing))
