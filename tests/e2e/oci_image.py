"""OCI images built by hand for the end-to-end tests: no registry, no image tool.

Nothing here can be pulled on this machine (no registry is reachable), and an image is only
a few files: a layer tar, a config, a manifest and an index in OCI layout, which `ctr images
import` takes; `lab/oci_layout.py` writes them (`write_oci_archive`, shared with the lab's
Kubernetes images). This module owns the tests' images:
* `build_busybox_image`: the containers of the `ctr run --cni` tests (static busybox);
* `build_pause_image`: the CRI tests' sandbox image, `pause.c` beside this file compiled
  statically at test time (musl-gcc, else $CC or gcc with -static).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from lab.oci_layout import ImageArchive, busybox_entries, directories, entry, write_oci_archive

IMAGE_REF = "localhost/na-e2e/busybox:latest"
BUSYBOX = "/bin/busybox"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
PAUSE_REF = "localhost/na-e2e/pause:latest"


class ImageBuildError(RuntimeError):
    """A compiler exists but building the image failed."""


def build_busybox_image(dest_dir: str | os.PathLike, *, busybox: str = BUSYBOX,
                        ref: str = IMAGE_REF) -> ImageArchive:
    """Build a one-layer image from the static busybox: every applet as a symlink in /bin.

    The layer is left uncompressed (no gzip time on either side); the whole archive is about
    2 MB and takes a few tens of milliseconds to build.
    """
    return write_oci_archive(Path(dest_dir) / "busybox-oci.tar", busybox_entries(busybox), refs=[ref],
                             config={"Env": ["PATH=/bin"], "Cmd": ["sh"], "WorkingDir": "/"})


def _compiler() -> list[str] | None:
    if os.environ.get("CC"):
        return [os.environ["CC"], "-static"]
    for cc in ("musl-gcc", "gcc"):
        if shutil.which(cc):
            return [cc, "-static"]
    return None


def build_pause_image(dest_dir: Path, *, ref: str = PAUSE_REF) -> ImageArchive | str:
    """Compile pause.c statically and wrap it as an OCI image; a string says why not."""
    cc = _compiler()
    if cc is None:
        return "no C compiler for the pause image (apt-get install musl-tools)"
    binary = dest_dir / "pause"
    proc = subprocess.run([*cc, "-Os", "-s", "-Wall", "-o", str(binary), str(PAUSE_SOURCE)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ImageBuildError(f"compiling {PAUSE_SOURCE} failed:\n{proc.stderr}")
    entries = [*directories("dev", "etc", "proc", "sys"), entry("pause", data=binary.read_bytes(), mode=0o755)]
    return write_oci_archive(dest_dir / "pause-oci.tar", entries, refs=[ref],
                             config={"Entrypoint": ["/pause"], "WorkingDir": "/"})
