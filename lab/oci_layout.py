"""OCI images written by hand: a one-layer image as the tar `ctr images import` takes.

No registry is reachable on this project's machines, and an image of a few static files needs
no image tool: a layer tar, a config, a manifest and an index in OCI layout. This module owns
writing them, for the lab's Kubernetes images (`lab/kubernetes/images.py`: pause, CoreDNS,
busybox) and for the end-to-end tests' (`tests/e2e/oci_image.py`).

containerd 1.6's `ctr images import` names an image after its index entry's annotation
`io.containerd.image.name`, kept exactly as written (no `docker.io/` normalisation, no
`--base-name` needed); an image with several names is one manifest with one index entry per
name. Layers are left uncompressed (no gzip on either side), entries owned by root with
mtime 0, so the same files always make the same digests.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

TarEntry = tuple[tarfile.TarInfo, bytes | None]
IMAGE_NAME_ANNOTATION = "io.containerd.image.name"  # what ctr 1.6 names an imported image
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclasses.dataclass(frozen=True)
class ImageArchive:
    """An image archive ready for `ctr images import`, and every name it is imported under."""
    path: Path
    refs: tuple[str, ...]

    @property
    def ref(self) -> str:
        """The image's first (main) name."""
        return self.refs[0]


def digest_of(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def entry(name: str, *, data: bytes | None = None, mode: int = 0o644,
          kind: bytes = tarfile.REGTYPE, link: str = "") -> TarEntry:
    """One tar member: a file (`data`), a directory (`kind=DIRTYPE`) or a link (`link`)."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    if data is not None:
        info.size = len(data)
    return info, data


def directories(*names: str) -> list[TarEntry]:
    return [entry(name, mode=0o755, kind=tarfile.DIRTYPE) for name in names]


def tar_bytes(entries: Iterable[TarEntry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.mtime = 0
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def write_oci_archive(path: str | os.PathLike[str], entries: Iterable[TarEntry], *,
                      refs: Sequence[str], config: Mapping[str, object]) -> ImageArchive:
    """Write a one-layer OCI image layout tar to `path`, named by every ref in `refs`:
    `entries` form the layer, `config` is the image's runtime config (Env, Entrypoint...)."""
    if not refs:
        raise ValueError("an image needs at least one name")
    layer = tar_bytes(entries)
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [digest_of(layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest_of(image_config), "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest_of(layer), "size": len(layer)}],
    }).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest_of(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {IMAGE_NAME_ANNOTATION: ref,
                                       REF_NAME_ANNOTATION: ref.rsplit(":", 1)[1]}}
                      for ref in refs],
    }).encode()
    archive = [entry("oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}'),
               entry("index.json", data=index), *directories("blobs", "blobs/sha256")]
    archive += [entry(f"blobs/sha256/{digest_of(b)[7:]}", data=b) for b in (layer, image_config, manifest)]
    Path(path).write_bytes(tar_bytes(archive))
    return ImageArchive(path=Path(path), refs=tuple(refs))


def busybox_entries(busybox: str | os.PathLike[str]) -> list[TarEntry]:
    """A root filesystem of one static busybox: every applet a symlink in /bin, PATH=/bin."""
    applets = subprocess.run([os.fspath(busybox), "--list"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.split()
    entries = directories("bin", "dev", "etc", "proc", "root", "run", "sys", "tmp")
    entries.append(entry("bin/busybox", data=Path(busybox).read_bytes(), mode=0o755))
    entries += [entry(f"bin/{a}", kind=tarfile.SYMTYPE, link="busybox", mode=0o777)
                for a in sorted(set(applets) - {"busybox"})]
    entries.append(entry("etc/hosts", data=b"127.0.0.1 localhost\n"))
    return entries
