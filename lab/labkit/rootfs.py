"""Debian root filesystems: cached debootstrap tarballs, steps run in a chroot, and `docker import`."""
import contextlib
import hashlib
import json
import re
import subprocess
from pathlib import Path

from .config import CACHE_DIR, DEBIAN_SUITE
from .run import LabError, log, run, run_logged

FALLBACK_MIRROR = "http://deb.debian.org/debian"


def debian_mirror() -> str:
    """The main-archive URI apt already uses for this suite (deb822 .sources or one-line sources.list)."""
    texts = [p.read_text() for p in sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    for text in texts:
        for stanza in text.split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if fields.get("Types", "").split()[:1] == ["deb"] and DEBIAN_SUITE in fields.get("Suites", "").split():
                return fields["URIs"].split()[0]
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        m = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{DEBIAN_SUITE}\s", sources.read_text(), re.M)
        if m:
            return m.group(1)
    return FALLBACK_MIRROR


def hash_inputs(*parts) -> str:
    """Stable short hash of strings, bytes and files/folders (by relative path and content)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = [part] if part.is_file() else sorted(
                p for p in part.rglob("*")
                if p.is_file() and not any(x in p.parts for x in ("__pycache__", "build", ".pytest_cache"))
                and not any(x.endswith(".egg-info") for x in p.parts) and p.suffix != ".pyc")
            for f in files:
                h.update(str(f.relative_to(part.parent)).encode() + b"\0" + f.read_bytes() + b"\0")
        else:
            h.update((part if isinstance(part, bytes) else str(part).encode()) + b"\0")
    return h.hexdigest()[:12]


def base_tarball(packages: list[str]) -> Path:
    """debootstrap --variant=minbase with extra packages, cached as a tarball keyed by what went in."""
    mirror = debian_mirror()
    key = hash_inputs(json.dumps([DEBIAN_SUITE, "minbase", mirror, sorted(packages)]))
    tarball = CACHE_DIR / f"debootstrap-{DEBIAN_SUITE}-{key}.tar"
    if tarball.exists():
        log(f"debootstrap cache hit: {tarball.name}")
        return tarball
    target = CACHE_DIR / "tmp" / f"debootstrap-{key}"
    _remove_tree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "debs").mkdir(parents=True, exist_ok=True)
    logfile = CACHE_DIR / f"debootstrap-{key}.log"
    log(f"debootstrap {DEBIAN_SUITE} from {mirror} (log: {logfile})")
    run_logged(["debootstrap", "--variant=minbase", f"--cache-dir={CACHE_DIR / 'debs'}",
                "--include=" + ",".join(packages), DEBIAN_SUITE, str(target), mirror], logfile, timeout=1800)
    # Nothing machine-specific or re-downloadable goes into the cache.
    for junk in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "etc/ssh/ssh_host_*", "etc/hostname",
                 "etc/resolv.conf", "tmp/*", "var/log/*.log", "usr/share/doc/*", "usr/share/man/*"):
        for p in target.glob(junk):
            _remove_tree(p)
    (target / "etc/machine-id").write_text("")
    pack(target, tarball)
    _remove_tree(target)
    return tarball


def pack(root: Path, tarball: Path) -> None:
    """Write root as tarball; a tarball only ever exists complete."""
    partial = tarball.with_suffix(".partial")
    run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "-C", str(root),
         "-cf", str(partial), "."], timeout=600)
    partial.rename(tarball)


@contextlib.contextmanager
def unpacked(tarball: Path, name: str):
    """A scratch copy of a cached rootfs, removed afterwards."""
    root = CACHE_DIR / "tmp" / name
    _remove_tree(root)
    root.mkdir(parents=True)
    try:
        run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "-C", str(root),
             "-xf", str(tarball)], timeout=600)
        yield root
    finally:
        _remove_tree(root)


def chroot_sh(root: Path, script: str, *, binds: dict[Path, str], env: dict[str, str], timeout: int,
              logfile: Path) -> None:
    """Run a shell script inside root, in a private mount namespace so every bind vanishes with it.

    binds maps host paths to paths inside root; they exist only while the script runs, so build-time
    secrets such as the CA bundle never land in the image.
    """
    mounts = [f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev",
              f"touch {root}/etc/resolv.conf", f"mount --bind /etc/resolv.conf {root}/etc/resolv.conf"]
    for host, inner in binds.items():
        dest = f"{root}{inner}"
        mounts.append(f"mkdir -p {dest}" if host.is_dir() else f"mkdir -p $(dirname {dest}) && touch {dest}")
        mounts.append(f"mount --bind -o ro {host} {dest}" if host.is_file() else f"mount --bind {host} {dest}")
    envs = " ".join(f"{k}='{v}'" for k, v in {"HOME": "/root", "LANG": "C.UTF-8",
                                               "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                               **env}.items())
    outer = " && ".join(mounts) + f" && exec chroot {root} /usr/bin/env -i {envs} /bin/sh -ec \"$0\""
    run_logged(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-ec", outer, script], logfile,
               timeout=timeout)
    # Leftover mount points (empty files/dirs) and the build's resolv.conf are not part of the image.
    for inner in list(binds.values()) + ["/etc/resolv.conf"]:
        _remove_tree(Path(f"{root}{inner}"))


def docker_import(root: Path, tag: str, changes: list[str], timeout: int = 900) -> str:
    """Tar root straight into `docker import`; returns the new image id."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=security.capability",
                            "-C", str(root), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        args = ["docker", "import"] + [a for c in changes for a in ("--change", c)] + ["-", tag]
        image_id = run(args, stdin=tar.stdout, timeout=timeout).stdout.strip()
    finally:
        tar.stdout.close()
        if tar.wait(timeout=60) != 0:
            raise LabError(f"tar of {root} failed")
    return image_id


def _remove_tree(path: Path) -> None:
    """rm -rf that never crosses into another filesystem (a leftover bind mount of /dev, say)."""
    if path.exists() or path.is_symlink():
        run(["rm", "-rf", "--one-file-system", str(path)], timeout=600)
