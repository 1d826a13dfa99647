"""The container images a real Kubernetes cluster in the lab needs, built offline and imported
into a node's containerd under exactly the names Kubernetes asks for.

No registry is reachable and nothing can be pulled, so every image kubelet (the sandbox image
containerd's CRI names) and the upstream sig-network e2e suite (test/e2e/network/**, netpol,
test/e2e/framework) would pull must already be in the node's containerd, namespace `k8s.io`
(the CRI plugin's), under the name the pod spec says. This module owns: which images those are
(`E2E_IMAGES`: pinned as the pinned Kubernetes' test/utils/image/manifest.go spells them, and
held against that file, so a bump of k8s/go.mod that moves one stops the build), building each
into an archive under a cache directory (rebuilt only when a digest of its inputs changes: the
digest is in the file name), and importing them (`import_all`).

image (names)                                     built as
registry.k8s.io/pause:<Pause> (PAUSE_IMAGE)       one file, k8s/pause/pause.c (static), by hand
registry.k8s.io/coredns/coredns:v<COREDNS_VERSION> one file, k8s/coredns (CoreDNS's own main)
e2e-test-images/agnhost:<Agnhost>, and under      podman: the Debian base, upstream's Dockerfile
  agnhost:<AgnhostPrev>, glibc-dns-testing,       in Debian's packages, /coredns, /agnhost,
  nginx:<Nginx>                                   agnhost-2, user 1000 in group 50000
e2e-test-images/busybox:<BusyBox>                 Debian's static busybox, by hand
build-image/distroless-iptables:<...>             podman: the Debian base + iptables, conntrack
e2e-test-images/regression-issue-74839:<...>      one file, upstream's test/images program
localhost/netagent:<pyproject version>            scripts/build-image, saved (cached by image ID)

Aliases, and why they serve: glibc-dns-testing is upstream's Debian + dnsutils + /coredns, which
the agnhost image is (so the DNS specs' "musl" prober runs glibc too: ours is not Alpine);
agnhost:2.55 (statefulset fixtures) is agnhost; nginx is only run by the Endpoints and
EndpointSlice specs, which never dial it (ports 3000-3002), so agnhost's `pause` serves.
Not built: agnhost:2.6 of gcr.io/k8s-authenticated-test and invalid.registry.k8s.io (specs
expect those pulls to fail), volume/nfs (needs the kernel's nfsd, storage specs),
apparmor-loader (no AppArmor here), resource-consumer (autoscaling specs), and the rest of
manifest.go, which no network spec names.

containerd 1.6, as measured: `ctr -n k8s.io images import` keeps a docker-archive's RepoTags
and an OCI index entry's `io.containerd.image.name` exactly as written, unpacks into overlayfs,
and the CRI plugin sees the result (ImageStatus by name, the sandbox image included). podman's
images are saved as one docker-archive per Containerfile (`podman save -m`: every stage's
names, shared layers once, uncompressed so nothing is gzipped on either side).
Measured (2 cores, shared with a Go build): the podman build about 40 s the first time (apt in
both stages), the hand-made ones under a second; a second `build_all` with nothing changed
0.7-1.3 s (file digests and podman inspect); archives: agnhost + distroless-iptables 289 MB,
netagent 191 MB, coredns 79 MB, busybox and regression-issue-74839 2 MB each, pause 40 KB;
importing all into one containerd about 20 s. An imported image cannot be pulled again, so
kubelet's image garbage collection must never need to remove one.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from lab.oci_layout import ImageArchive, busybox_entries, directories, entry, write_oci_archive
from lab.state import LabError

StrPath = str | os.PathLike[str]

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = REPO / "build" / "kubernetes" / "bin"
CACHE_DIR = REPO / "build" / "kubernetes" / "images"
COREDNS_GO_MOD = REPO / "k8s" / "coredns" / "go.mod"
MANIFEST = Path("test/utils/image/manifest.go")  # in k8s.io/kubernetes' source
PORTER = Path("test/images/agnhost/porter")  # agnhost's TLS pair, copied into its image
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_IMAGE = "localhost/debian:12-local"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static
CRI_NAMESPACE = "k8s.io"
PODMAN = ("podman", "--runtime", "runc")  # crun refuses the hybrid cgroup layout
BUILD_FLAGS = ("--network", "host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768")
LABEL = "netagent.kubernetes-image"  # on podman's images: key and input digest
RECIPE_VERSION = "1"  # bump when the way an image is made changes without its inputs changing

# The names of the ImageIDs built here, as the pinned Kubernetes' (k8s/go.mod)
# test/utils/image/manifest.go spells them (the rest: the docstring says why not built).
# `check_pins` holds them against that file (build_all, and the unit tests).
E2E_IMAGES = {
    "Pause": "registry.k8s.io/pause:3.10.2",
    "Agnhost": "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
    "AgnhostPrev": "registry.k8s.io/e2e-test-images/agnhost:2.55",
    "GlibcDnsTesting": "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
    "Nginx": "registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
    "BusyBox": "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
    "DistrolessIptables": "registry.k8s.io/build-image/distroless-iptables:v0.9.9",
    "RegressionIssue74839": "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5",
}
AGNHOST_IDS = ("Agnhost", "AgnhostPrev", "GlibcDnsTesting", "Nginx")  # one image, these names
PAUSE_IMAGE = E2E_IMAGES["Pause"]  # containerd's sandbox_image, and the e2e framework's pause
AGNHOST_IMAGE = E2E_IMAGES["Agnhost"]
COREDNS_VERSION = "v1.15.0"  # k8s/coredns/go.mod's, held against it by check_pins too
COREDNS_IMAGE = f"registry.k8s.io/coredns/coredns:{COREDNS_VERSION}"


class ImagesError(LabError):
    """An image cannot be built or imported; the message says what to do."""


# ---------------------------------------------------------------- names

_REGISTRY = re.compile(r'^\s*(\w+):\s*"([^"]+)",?\s*$', re.M)
_CONFIG = re.compile(r'configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*"([^"]+)",\s*"([^"]+)"\}')


def parse_manifest(text: str) -> dict[str, str]:
    """manifest.go's default image of every ImageID, as `GetE2EImage` spells it: registry/name:tag."""
    block = text[text.index("initRegistry = RegistryList{"):]
    block = block[:block.index("}")]
    registries = dict(_REGISTRY.findall(block))
    refs = {}
    for image_id, registry_field, name, version in _CONFIG.findall(text):
        if registry_field not in registries:
            raise ImagesError(f"manifest.go: {image_id} names unknown registry {registry_field}")
        refs[image_id] = f"{registries[registry_field]}/{name}:{version}"
    return refs


def coredns_version(go_mod: str) -> str:
    """The CoreDNS version k8s/coredns/go.mod requires, e.g. "v1.15.0"."""
    found = re.search(r"^\s*(?:require\s+)?github\.com/coredns/coredns\s+(v\S+)", go_mod, re.M)
    if found is None:
        raise ImagesError("k8s/coredns/go.mod requires no github.com/coredns/coredns")
    return found.group(1)


def _run(argv: Sequence[str], *, timeout: float, what: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ImagesError(f"{what} failed ({' '.join(argv)}):\n{(proc.stderr or proc.stdout)[-3000:]}")
    return proc.stdout


def upstream_source() -> Path:
    """The pinned Kubernetes' source (k8s/go.mod's version, as scripts/build-kubernetes reads
    it) in the Go module cache, where that script downloaded it."""
    version = _run([str(REPO / "scripts" / "build-kubernetes"), "--version"], timeout=30,
                   what="the pinned Kubernetes version").strip()
    source = _go_module_cache() / f"k8s.io/kubernetes@{version}"
    if not (source / MANIFEST).is_file():
        raise ImagesError(f"{source / MANIFEST} is missing: run scripts/build-kubernetes (it downloads it)")
    return source


def _go_module_cache() -> Path:
    try:
        return Path(_run(["go", "env", "GOMODCACHE"], timeout=30, what="go env").strip())
    except FileNotFoundError:  # no go on PATH: its defaults
        gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
        return Path(os.environ.get("GOMODCACHE") or Path(gopath) / "pkg" / "mod")


def pin_drift(manifest: str, coredns_go_mod: str) -> list[str]:
    """How the pinned names differ from manifest.go's and k8s/coredns/go.mod's (none: [])."""
    upstream = parse_manifest(manifest)
    drift = [f"{i}: pinned {ref}, manifest.go {upstream.get(i)}" for i, ref in E2E_IMAGES.items()
             if upstream.get(i) != ref]
    if coredns_version(coredns_go_mod) != COREDNS_VERSION:
        drift.append(f"CoreDNS: pinned {COREDNS_VERSION}, k8s/coredns/go.mod {coredns_version(coredns_go_mod)}")
    return drift


def check_pins(source: Path) -> None:
    drift = pin_drift((source / MANIFEST).read_text(), COREDNS_GO_MOD.read_text())
    if drift:
        raise ImagesError("update the pins in lab/kubernetes/images.py:\n  " + "\n  ".join(drift))


# ---------------------------------------------------------------- what each image is

@dataclasses.dataclass(frozen=True)
class LayoutImage:
    """A few static files written by hand as an OCI layout (lab/oci_layout.py): no image tool."""
    key: str
    refs: tuple[str, ...]
    files: tuple[tuple[str, Path], ...]  # (path in the image, the host's executable)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    busybox: Path | None = None  # the root filesystem of this static busybox, under the files

    def config(self) -> dict[str, object]:
        config: dict[str, object] = {"Env": [PATH_ENV], "WorkingDir": "/"}
        config.update({k: list(v) for k, v in (("Entrypoint", self.entrypoint), ("Cmd", self.cmd)) if v})
        return config

    def recipe(self) -> str:
        return json.dumps({"files": [name for name, _ in self.files], "config": self.config(),
                           "busybox": self.busybox is not None})

    def inputs(self) -> tuple[Path, ...]:
        return (*(path for _, path in self.files), *((self.busybox,) if self.busybox else ()))


@dataclasses.dataclass(frozen=True)
class PodmanImage:
    """A Containerfile built by podman from the Debian base: each stage an image of its names."""
    key: str
    containerfile: str  # `{base}` stands for the base image
    stages: tuple[tuple[str, tuple[str, ...]], ...]  # (stage, its names)
    context: tuple[Path, ...]  # copied into the build context under their own names

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(ref for _, names in self.stages for ref in names)

    def recipe(self) -> str:
        return json.dumps({"containerfile": self.containerfile, "stages": self.stages})

    def inputs(self) -> tuple[Path, ...]:
        return self.context


Image = LayoutImage | PodmanImage

AGNHOST_CONTAINERFILE = """\
FROM {base} AS agnhost
# upstream's test/images/agnhost/Dockerfile, its apk packages in Debian's names (dig, curl, nc,
# ss, ipcs, iperf, bash, socat); coredns is ours (k8s/coredns); no fake registry (/var/registry).
RUN apt-get update \\
 && apt-get install -y --no-install-recommends bind9-dnsutils curl netcat-openbsd iproute2 \\
      iperf bash util-linux socat \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && ln -s /usr/bin/iperf /usr/local/bin/iperf \\
 && mkdir /uploads \\
 && groupadd -g 50000 group-defined-in-image \\
 && useradd -u 1000 -G group-defined-in-image -M user-defined-in-image
COPY coredns localhost.crt localhost.key agnhost /
RUN ln -s agnhost /agnhost-2
EXPOSE 80 8080 8081 9376 5000
ENTRYPOINT ["/agnhost"]
CMD ["pause"]

FROM {base} AS iptables
# distroless-iptables (kube-proxy's base): the tools the e2e specs exec in it
RUN apt-get update \\
 && apt-get install -y --no-install-recommends iptables conntrack ipset \\
 && apt-get clean && rm -rf /var/lib/apt/lists/*
"""


def cluster_images(*, source: Path, bin_dir: Path = BIN_DIR, refs: Mapping[str, str] = E2E_IMAGES,
                   coredns: str = COREDNS_IMAGE) -> list[Image]:
    """Every image of the cluster (but netagent's): their names, the upstream source (agnhost's
    porter TLS pair) and the binaries scripts/build-kubernetes made."""
    porter = source / PORTER
    return [
        LayoutImage("pause", (refs["Pause"],), (("pause", bin_dir / "pause"),), entrypoint=("/pause",)),
        LayoutImage("coredns", (coredns,), (("coredns", bin_dir / "coredns"),), entrypoint=("/coredns",)),
        LayoutImage("busybox", (refs["BusyBox"],), (), cmd=("sh",), busybox=BUSYBOX),
        LayoutImage("regression-issue-74839", (refs["RegressionIssue74839"],),
                    (("regression-issue-74839", bin_dir / "regression-issue-74839"),),
                    entrypoint=("/regression-issue-74839",)),
        PodmanImage("agnhost", AGNHOST_CONTAINERFILE,
                    (("agnhost", tuple(refs[i] for i in AGNHOST_IDS)), ("iptables", (refs["DistrolessIptables"],))),
                    (bin_dir / "coredns", porter / "localhost.crt", porter / "localhost.key", bin_dir / "agnhost")),
    ]


# ---------------------------------------------------------------- inputs and the cache

def input_digest(image: Image, *, base_id: str = "") -> str:
    """The digest of everything an image is made from: its recipe and names, each input
    file's name and content, and (podman) the base image's ID."""
    h = hashlib.sha256(f"{RECIPE_VERSION}\0{type(image).__name__}\0{image.recipe()}\0{image.refs}\0{base_id}".encode())
    for path in image.inputs():
        if not path.is_file():
            raise ImagesError(f"{path} is missing: scripts/build-kubernetes builds it")
        stat = path.stat()
        h.update(f"\0{path.name}\0".encode() + _file_digest(path, stat.st_size, stat.st_mtime_ns))
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _file_digest(path: Path, size: int, mtime_ns: int) -> bytes:
    """A file's sha256, remembered while its size and mtime stay (coredns is read twice)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def archive_path(cache_dir: Path, key: str, digest: str) -> Path:
    return cache_dir / f"{key}-{digest}.tar"


def _install(tmp: Path, final: Path) -> None:
    """Move a finished archive into place and drop the key's older ones."""
    key = final.name.rsplit("-", 1)[0]
    os.replace(tmp, final)
    for old in final.parent.glob(f"{key}-*.tar"):
        if old != final and old.name.rsplit("-", 1)[0] == key:
            old.unlink()


def _podman(*args: str, timeout: float = 120, what: str = "podman") -> str:
    return _run([*PODMAN, *args], timeout=timeout, what=what)


def base_image_id() -> str:
    """The Debian base's image ID; the base is made (scripts/make-base-image) when missing."""
    probe = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if probe.returncode == 0:
        return probe.stdout.strip()
    _run([str(REPO / "scripts" / "make-base-image"), BASE_IMAGE], timeout=600, what="make-base-image")
    return _podman("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE).strip()


def _write_layout(image: LayoutImage, out: Path) -> None:
    entries = busybox_entries(image.busybox) if image.busybox else directories("dev", "etc", "proc", "sys", "tmp")
    entries += [entry(name, data=path.read_bytes(), mode=0o755) for name, path in image.files]
    write_oci_archive(out, entries, refs=image.refs, config=image.config())


def _build_podman(image: PodmanImage, out: Path, *, digest: str, work_dir: Path) -> None:
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=f".{image.key}-context-") as context:
        for path in image.context:
            target = Path(context) / path.name
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
        (Path(context) / "Containerfile").write_text(image.containerfile.format(base=BASE_IMAGE))
        for stage, names in image.stages:
            tags = [arg for name in names for arg in ("-t", name)]
            _podman("build", *BUILD_FLAGS, "--target", stage, "--label", f"{LABEL}={image.key}-{digest}",
                    *tags, "-f", f"{context}/Containerfile", context, timeout=1800, what=f"building {stage}")
    _podman("save", "--format", "docker-archive", "-m", "-o", str(out), *image.refs, timeout=600,
            what=f"saving {image.key}")
    _prune(image.key, digest)


def _prune(key: str, digest: str) -> None:
    """Earlier builds of the key, untagged by this one, go (build-step layers stay as cache)."""
    listed = _podman("images", "--no-trunc", "--filter", "dangling=true", "--filter", f"label={LABEL}",
                     "--format", f'{{{{.ID}}}} {{{{index .Labels "{LABEL}"}}}}')
    for line in listed.splitlines():
        image_id, _, label = line.partition(" ")
        if label.rsplit("-", 1)[0] == key and label != f"{key}-{digest}":
            subprocess.run([*PODMAN, "rmi", image_id], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def build_image(image: Image, cache_dir: Path = CACHE_DIR) -> ImageArchive:
    """The image's archive in `cache_dir`: the cached one when its inputs are unchanged."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = input_digest(image, base_id=base_image_id() if isinstance(image, PodmanImage) else "")
    final = archive_path(cache_dir, image.key, digest)
    if not final.is_file():
        tmp = cache_dir / f".{final.name}.{os.getpid()}.tmp"
        try:
            if isinstance(image, LayoutImage):
                _write_layout(image, tmp)
            else:
                _build_podman(image, tmp, digest=digest, work_dir=cache_dir)
            _install(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return ImageArchive(path=final, refs=image.refs)


def netagent_archive(cache_dir: Path = CACHE_DIR, *, ebpf: bool = False) -> ImageArchive:
    """The agent's image (scripts/build-image, rebuilt there only when stale; with `ebpf`, its
    eBPF variant), saved once per image ID."""
    out = _run([str(REPO / "scripts" / "build-image"), "--if-stale", *(["--ebpf"] if ebpf else [])],
               timeout=1800, what="scripts/build-image")
    tag = out.strip().splitlines()[-1]
    image_id = _podman("image", "inspect", "--format", "{{.Id}}", tag).strip()
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = archive_path(cache_dir, "netagent-ebpf" if ebpf else "netagent", image_id[:16])
    if not final.is_file():
        tmp = cache_dir / f".{final.name}.{os.getpid()}.tmp"
        try:
            _podman("save", "--format", "docker-archive", "-o", str(tmp), tag, timeout=600, what="saving netagent")
            _install(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return ImageArchive(path=final, refs=(tag,))


def build_all(cache_dir: StrPath = CACHE_DIR, *, bin_dir: StrPath = BIN_DIR,
              netagent: bool = True, ebpf: bool = False) -> list[ImageArchive]:
    """Every image the cluster needs (and the agent's, with `netagent`; its eBPF variant with
    `ebpf`), as archives in `cache_dir`, built or found there; `bin_dir`: scripts/build-kubernetes'
    output."""
    source = upstream_source()
    check_pins(source)
    images = cluster_images(source=source, bin_dir=Path(bin_dir))
    archives = [build_image(image, Path(cache_dir)) for image in images]
    return [*archives, netagent_archive(Path(cache_dir), ebpf=ebpf)] if netagent else archives


# ---------------------------------------------------------------- into a containerd

def in_cri_namespace(ctr: Sequence[str]) -> list[str]:
    """`ctr` (an argv prefix) in namespace k8s.io, unless the prefix already names one."""
    named = any(arg in ("-n", "--namespace") or arg.startswith("--namespace=") for arg in ctr)
    return list(ctr) if named else [*ctr, "--namespace", CRI_NAMESPACE]


def image_names(ctr: Sequence[str]) -> set[str]:
    """The image names in the CRI's namespace of the containerd `ctr` (an argv prefix) talks to."""
    return set(_run([*in_cri_namespace(ctr), "images", "ls", "-q"], timeout=60, what="ctr images ls").split())


def import_all(ctr: Sequence[str], archives: Iterable[ImageArchive], *, timeout: float = 600) -> None:
    """Import every archive into namespace k8s.io (unpacked into the default snapshotter) with
    `ctr` (an argv prefix such as ["ctr", "--address", SOCK]); then check every name is there."""
    archives = list(archives)
    for archive in archives:
        _run([*in_cri_namespace(ctr), "images", "import", str(archive.path)], timeout=timeout,
             what=f"importing {archive.path.name}")
    names = image_names(ctr)
    missing = [ref for archive in archives for ref in archive.refs if ref not in names]
    if missing:
        raise ImagesError(f"after the import, containerd lacks {missing}; it has {sorted(names)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kubernetes.images",
                                     description="Build the lab cluster's images (and import them).")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="archive directory (%(default)s)")
    parser.add_argument("--bin", type=Path, default=BIN_DIR, help="scripts/build-kubernetes' output (%(default)s)")
    parser.add_argument("--no-netagent", action="store_true", help="leave the agent's image out")
    parser.add_argument("--address", help="also import into the containerd at this socket")
    args = parser.parse_args(argv)
    try:
        archives = build_all(args.cache, bin_dir=args.bin, netagent=not args.no_netagent)
        if args.address:
            import_all(["ctr", "--address", args.address], archives)
    except ImagesError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for archive in archives:
        print(archive.path, *archive.refs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
