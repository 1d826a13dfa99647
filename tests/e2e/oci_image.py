"""OCI images built by hand for the end-to-end tests: no registry, no image tool.

Nothing here can be pulled on this machine (no registry is reachable), and an image is only
a few files: a layer tar, a config, a manifest and an index in OCI layout, which `ctr images
import` takes. This module owns building them:
* `build_oci_image`: any one-layer image from tar entries (`entry(...)`) and a config;
* `build_busybox_image`: the containers of the `ctr run --cni` tests (static busybox);
* `build_pause_image`: the CRI tests' sandbox image, `pause.c` beside this file compiled
  statically at test time (musl-gcc, else $CC or gcc with -static).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

IMAGE_REF = "localhost/na-e2e/busybox:latest"
BUSYBOX = "/bin/busybox"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
PAUSE_REF = "localhost/na-e2e/pause:latest"


class ImageBuildError(RuntimeError):
    """A compiler exists but building the image failed."""


@dataclasses.dataclass(frozen=True)
class ImageArchive:
    """An OCI image layout as a tar, ready for `ctr images import`."""
    path: Path
    ref: str


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _tar_bytes(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.mtime = 0
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def entry(name: str, *, data: bytes | None = None, mode: int = 0o644,
           kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    if data is not None:
        info.size = len(data)
    return info, data


def build_oci_image(path: str | os.PathLike, entries, *, ref: str, config: dict) -> ImageArchive:
    """Write a one-layer OCI image layout tar to `path`: `entries` (from `_entry`) form the
    uncompressed layer, `config` is the image's runtime config (Env, Cmd, Entrypoint...)."""
    layer = _tar_bytes(entries)
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _digest(image_config), "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer), "size": len(layer)}],
    }).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": _digest(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       # ctr 1.6 names the imported image after this annotation.
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}}],
    }).encode()
    archive = [entry("oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}'),
               entry("index.json", data=index),
               entry("blobs", mode=0o755, kind=tarfile.DIRTYPE),
               entry("blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE)]
    archive += [entry(f"blobs/sha256/{_digest(b)[7:]}", data=b) for b in (layer, image_config, manifest)]
    Path(path).write_bytes(_tar_bytes(archive))
    return ImageArchive(path=Path(path), ref=ref)


def build_busybox_image(dest_dir: str | os.PathLike, *, busybox: str = BUSYBOX,
                        ref: str = IMAGE_REF) -> ImageArchive:
    """Build a one-layer image from the static busybox: every applet as a symlink in /bin.

    The layer is left uncompressed (no gzip time on either side); the whole archive is about
    2 MB and takes a few tens of milliseconds to build.
    """
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True,
                             timeout=10).stdout.split()
    entries = [entry(d, mode=0o755, kind=tarfile.DIRTYPE)
               for d in ("bin", "dev", "etc", "proc", "root", "run", "sys", "tmp")]
    entries.append(entry("bin/busybox", data=Path(busybox).read_bytes(), mode=0o755))
    entries += [entry(f"bin/{a}", kind=tarfile.SYMTYPE, link="busybox", mode=0o777)
                for a in sorted(set(applets) - {"busybox"})]
    entries.append(entry("etc/hosts", data=b"127.0.0.1 localhost\n"))
    return build_oci_image(Path(dest_dir) / "busybox-oci.tar", entries, ref=ref,
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
    entries = [entry(d, mode=0o755, kind=tarfile.DIRTYPE) for d in ("dev", "etc", "proc", "sys")]
    entries.append(entry("pause", data=binary.read_bytes(), mode=0o755))
    return build_oci_image(dest_dir / "pause-oci.tar", entries, ref=ref,
                           config={"Entrypoint": ["/pause"], "WorkingDir": "/"})
