"""lab/kubernetes/images.py and lab/oci_layout.py, the pure parts: the pinned image names held
against manifest.go (a sample, and the pinned Kubernetes' own when its source is in the Go
module cache) and CoreDNS's go.mod, which image carries which names, the input digests
(changing exactly when an input changes), the cache of archives, and the hand-written OCI layout.

Building the podman images and importing into a real containerd is not a unit's job: the report
of that proof is in the module's docstring.
"""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lab import oci_layout
from lab.kubernetes import images
from lab.kubernetes.images import ImagesError, LayoutImage, PodmanImage

MANIFEST_SAMPLE = '''
var (
	initRegistry = RegistryList{
		// a comment the parser skips
		PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
		BuildImageRegistry:       "registry.k8s.io/build-image",
		GcRegistry:               "registry.k8s.io",
		PrivateRegistry:          "gcr.io/k8s-authenticated-test",
	}

	registry, imageConfigs, originalImageConfigs = readRepoList(os.Getenv("KUBE_TEST_REPO_LIST"))
)

func initImageConfigs(list RegistryList) (map[ImageID]Config, map[ImageID]Config) {
	configs := map[ImageID]Config{}
	configs[AgnhostPrev] = Config{list.PromoterE2eRegistry, "agnhost", "2.55"}
	configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
	configs[AgnhostPrivate] = Config{list.PrivateRegistry, "agnhost", "2.6"}
	configs[BusyBox] = Config{list.PromoterE2eRegistry, "busybox", "1.37.0-2"}
	configs[DistrolessIptables] = Config{list.BuildImageRegistry, "distroless-iptables", "v0.9.9"}
	configs[GlibcDnsTesting] = Config{list.PromoterE2eRegistry, "glibc-dns-testing", "2.1.1"}
	configs[Nginx] = Config{list.PromoterE2eRegistry, "nginx", "1.27.0-2"}
	configs[NodePerfNpbEp] = Config{list.PromoterE2eRegistry, "node-perf/npb-ep", "1.6.0"}
	// Pause - when these values are updated, also update cmd/kubelet/app/options/container_runtime.go
	configs[Pause] = Config{list.GcRegistry, "pause", "3.10.2"}
	configs[RegressionIssue74839] = Config{list.PromoterE2eRegistry, "regression-issue-74839", "1.5"}
'''
SAMPLE_REFS = images.parse_manifest(MANIFEST_SAMPLE)


def test_manifest_names_are_spelled_as_get_e2e_image_does() -> None:
    assert SAMPLE_REFS["Pause"] == "registry.k8s.io/pause:3.10.2"
    assert SAMPLE_REFS["Agnhost"] == "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
    assert SAMPLE_REFS["AgnhostPrivate"] == "gcr.io/k8s-authenticated-test/agnhost:2.6"
    assert SAMPLE_REFS["DistrolessIptables"] == "registry.k8s.io/build-image/distroless-iptables:v0.9.9"
    assert SAMPLE_REFS["NodePerfNpbEp"] == "registry.k8s.io/e2e-test-images/node-perf/npb-ep:1.6.0"



def test_the_cri_namespace_is_added_unless_the_prefix_names_one() -> None:
    assert images.in_cri_namespace(["ctr", "--address", "/s"]) == ["ctr", "--address", "/s", "--namespace", "k8s.io"]
    named = ["ip", "netns", "exec", "n1", "ctr", "--address", "/s", "--namespace", "k8s.io"]
    assert images.in_cri_namespace(named) == named


def test_a_config_naming_an_unknown_registry_is_refused() -> None:
    bad = MANIFEST_SAMPLE.replace("list.GcRegistry", "list.GcEtcdRegistry")
    with pytest.raises(ImagesError, match="GcEtcdRegistry"):
        images.parse_manifest(bad)


def upstream_or_skip() -> Path:
    try:
        return images.upstream_source()
    except (ImagesError, OSError) as exc:
        pytest.skip(f"the pinned Kubernetes source is not here: {exc}")


def test_the_pins_are_the_pinned_kubernetes_own_names() -> None:
    source = upstream_or_skip()
    images.check_pins(source)  # raises on any drift
    # agnhost's tag is its image directory's VERSION; pause's is kubeadm's PauseVersion
    agnhost_version = (source / "test/images/agnhost/VERSION").read_text().strip()
    assert images.E2E_IMAGES["Agnhost"] == f"registry.k8s.io/e2e-test-images/agnhost:{agnhost_version}"
    kubeadm = (source / "cmd/kubeadm/app/constants/constants.go").read_text()
    assert f'PauseVersion = "{images.PAUSE_IMAGE.rsplit(":", 1)[1]}"' in kubeadm
    assert (source / images.PORTER / "localhost.crt").is_file()


def test_the_sample_agrees_with_the_pins_and_drift_is_named() -> None:
    go_mod = images.COREDNS_GO_MOD.read_text()
    assert images.pin_drift(MANIFEST_SAMPLE, go_mod) == []
    bumped = MANIFEST_SAMPLE.replace('"agnhost", "2.66.1"', '"agnhost", "2.67"')
    assert images.pin_drift(bumped, go_mod) == [
        "Agnhost: pinned registry.k8s.io/e2e-test-images/agnhost:2.66.1, manifest.go "
        "registry.k8s.io/e2e-test-images/agnhost:2.67"]
    gone = MANIFEST_SAMPLE.replace("configs[Nginx]", "configs[NginxOld]")
    assert images.pin_drift(gone, go_mod) == ["Nginx: pinned registry.k8s.io/e2e-test-images/nginx:1.27.0-2, "
                                              "manifest.go None"]
    newer_dns = go_mod.replace(images.COREDNS_VERSION, "v9.9.9")
    assert images.pin_drift(MANIFEST_SAMPLE, newer_dns) == [f"CoreDNS: pinned {images.COREDNS_VERSION}, "
                                                            "k8s/coredns/go.mod v9.9.9"]


def test_coredns_version_from_its_go_mod() -> None:
    assert images.coredns_version("module m\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns v1.15.0\n") == "v1.15.0"
    assert images.coredns_version("require (\n\tgithub.com/coredns/coredns v1.14.7\n\tx.y/z v1.0.0\n)\n") == "v1.14.7"
    with pytest.raises(ImagesError):
        images.coredns_version("module m\n")
    assert images.COREDNS_IMAGE == f"registry.k8s.io/coredns/coredns:{images.COREDNS_VERSION}"


def test_every_name_belongs_to_exactly_one_image(tmp_path: Path) -> None:
    by_key = {image.key: image for image in images.cluster_images(source=tmp_path / "k8s", bin_dir=tmp_path)}
    names = [ref for image in by_key.values() for ref in image.refs]
    assert len(names) == len(set(names))
    assert set(names) == {*images.E2E_IMAGES.values(), images.COREDNS_IMAGE}
    agnhost = by_key["agnhost"]
    assert isinstance(agnhost, PodmanImage)
    assert dict(agnhost.stages)["agnhost"][0] == SAMPLE_REFS["Agnhost"]  # its main name first
    assert dict(agnhost.stages)["iptables"] == (SAMPLE_REFS["DistrolessIptables"],)
    assert by_key["pause"].refs == (images.PAUSE_IMAGE,)
    assert by_key["coredns"].refs == (images.COREDNS_IMAGE,)
    assert "gcr.io/k8s-authenticated-test/agnhost:2.6" not in names  # meant to be unpullable


def test_the_agnhost_containerfile_keeps_upstreams_contract() -> None:
    text = images.AGNHOST_CONTAINERFILE
    for needed in ('ENTRYPOINT ["/agnhost"]', 'CMD ["pause"]', "ln -s agnhost /agnhost-2", "useradd -u 1000",
                   "groupadd -g 50000", "bind9-dnsutils", "netcat-openbsd", "iproute2", "iperf", "socat",
                   "COPY coredns localhost.crt localhost.key agnhost /", "FROM {base} AS agnhost",
                   "FROM {base} AS iptables", "conntrack"):
        assert needed in text, needed


def one_file_image(tmp_path: Path, content: bytes = b"\x7fELF pause", **changes: object) -> LayoutImage:
    binary = tmp_path / "pause"
    binary.write_bytes(content)
    fields: dict = dict(key="pause", refs=("registry.k8s.io/pause:3.10.2",), files=(("pause", binary),),
                        entrypoint=("/pause",))
    fields.update(changes)
    return LayoutImage(**fields)


def test_the_input_digest_changes_exactly_when_an_input_does(tmp_path: Path) -> None:
    first = images.input_digest(one_file_image(tmp_path))
    assert images.input_digest(one_file_image(tmp_path)) == first
    assert images.input_digest(one_file_image(tmp_path, b"\x7fELF pause, rebuilt")) != first
    assert images.input_digest(one_file_image(tmp_path, refs=("registry.k8s.io/pause:3.11",))) != first
    assert images.input_digest(one_file_image(tmp_path, entrypoint=("/pause", "-v"))) != first
    assert images.input_digest(one_file_image(tmp_path), base_id="sha256:aaaa") != first
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert images.input_digest(one_file_image(elsewhere)) == first  # where a file lies is no input


def test_a_podman_images_digest_follows_its_containerfile_context_and_base(tmp_path: Path) -> None:
    agnhost = tmp_path / "agnhost"
    agnhost.write_bytes(b"v1")
    image = PodmanImage("agnhost", "FROM {base}\nCOPY agnhost /\n", (("main", ("r/agnhost:1",)),), (agnhost,))
    first = images.input_digest(image, base_id="base-1")
    assert images.input_digest(image, base_id="base-2") != first
    changed = PodmanImage("agnhost", "FROM {base}\nCOPY agnhost /a\n", image.stages, image.context)
    assert images.input_digest(changed, base_id="base-1") != first
    agnhost.write_bytes(b"v2")
    assert images.input_digest(image, base_id="base-1") != first


def test_a_missing_binary_names_the_script_that_builds_it(tmp_path: Path) -> None:
    image = one_file_image(tmp_path, files=(("pause", tmp_path / "absent"),))
    with pytest.raises(ImagesError, match="scripts/build-kubernetes"):
        images.input_digest(image)


def test_the_cache_builds_once_and_replaces_the_older_archive(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    image = one_file_image(tmp_path)
    first = images.build_image(image, cache)
    assert first.path.name == f"pause-{images.input_digest(image)}.tar"
    stamp = first.path.stat().st_mtime_ns
    assert images.build_image(image, cache).path.stat().st_mtime_ns == stamp  # not written again
    (cache / "pause-other-key-0123456789abcdef.tar").write_bytes(b"")  # another key's archive stays
    second = images.build_image(one_file_image(tmp_path, b"\x7fELF pause, rebuilt"), cache)
    assert second.path != first.path
    assert sorted(p.name for p in cache.iterdir()) == sorted([second.path.name, "pause-other-key-0123456789abcdef.tar"])


def layout(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_an_oci_layout_names_its_one_manifest_once_per_ref(tmp_path: Path) -> None:
    refs = ("registry.k8s.io/e2e-test-images/agnhost:2.66.1", "registry.k8s.io/e2e-test-images/nginx:1.27.0-2")
    entries = [*oci_layout.directories("bin"), oci_layout.entry("bin/x", data=b"x", mode=0o755)]
    archive = oci_layout.write_oci_archive(tmp_path / "a.tar", entries, refs=refs, config={"Cmd": ["x"]})
    assert archive.ref == refs[0] and archive.refs == refs
    files = layout(archive.path)
    index = json.loads(files["index.json"])
    assert [m["annotations"][oci_layout.IMAGE_NAME_ANNOTATION] for m in index["manifests"]] == list(refs)
    assert [m["annotations"][oci_layout.REF_NAME_ANNOTATION] for m in index["manifests"]] == ["2.66.1", "1.27.0-2"]
    assert len({m["digest"] for m in index["manifests"]}) == 1
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"][7:]])
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert [(m.name, m.uid, m.mtime) for m in tar.getmembers()] == [("bin", 0, 0), ("bin/x", 0, 0)]
    again = oci_layout.write_oci_archive(tmp_path / "b.tar", entries, refs=refs, config={"Cmd": ["x"]})
    assert again.path.read_bytes() == archive.path.read_bytes()  # same files, same bytes
    with pytest.raises(ValueError):
        oci_layout.write_oci_archive(tmp_path / "c.tar", entries, refs=(), config={})


def test_a_one_file_images_config_runs_its_entrypoint(tmp_path: Path) -> None:
    config = one_file_image(tmp_path).config()
    assert config["Entrypoint"] == ["/pause"] and "Cmd" not in config
    assert LayoutImage("busybox", ("b:1",), (), cmd=("sh",)).config()["Cmd"] == ["sh"]
