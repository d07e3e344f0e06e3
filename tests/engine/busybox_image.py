"""A tiny image built without a registry: Debian's static busybox imported as a rootfs (`docker import`)."""

import io
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")  # from Debian's busybox-static package
IMAGE = "svl-dd-test/busybox:1"


def is_static_busybox() -> bool:
    if not BUSYBOX.is_file():
        return False
    out = subprocess.run(["file", "-L", str(BUSYBOX)], capture_output=True, text=True).stdout
    return "statically linked" in out


def _rootfs_tar() -> bytes:
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for directory in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":  # --list names busybox itself
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
    return buf.getvalue()


def build() -> str:
    """Imports the image as IMAGE and returns its id (sha256:...)."""
    subprocess.run(["docker", "import", "-c", "ENV PATH=/bin", "-", IMAGE], input=_rootfs_tar(),
                   capture_output=True, check=True)
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE], capture_output=True, text=True,
                          check=True).stdout.strip()


def remove() -> None:
    subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True)
