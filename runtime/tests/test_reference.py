"""docker:// reference parsing and default output names."""

import pytest

from berth.errors import BerthError
from berth.image.reference import default_output, in_enroot_form, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("uri, user, registry, repository, tag, digest", [
    ("docker://ubuntu", "", "registry-1.docker.io", "library/ubuntu", "latest", ""),
    ("docker://ubuntu:24.04", "", "registry-1.docker.io", "library/ubuntu", "24.04", ""),
    ("docker://nvcr.io#nvidia/cuda:12.9", "", "nvcr.io", "nvidia/cuda", "12.9", ""),
    ("docker://bob@nvcr.io#nvidia/cuda", "bob", "nvcr.io", "nvidia/cuda", "latest", ""),
    ("docker://127.0.0.1:5000#a/b/c:v1", "", "127.0.0.1:5000", "a/b/c", "v1", ""),
    (f"docker://busybox@{DIGEST}", "", "registry-1.docker.io", "library/busybox", "", DIGEST),
    (f"docker://bob@reg.io#x/y:t@{DIGEST}", "bob", "reg.io", "x/y", "t", DIGEST),
    ("docker://localreg#single", "", "localreg", "single", "latest", ""),
])
def test_parse(uri, user, registry, repository, tag, digest):
    ref = parse(uri)
    assert (ref.user, ref.registry, ref.repository, ref.tag, ref.digest) == \
        (user, registry, repository, tag, digest)
    assert ref.reference == (digest or tag)


@pytest.mark.parametrize("uri, message", [
    ("foo.sqsh", "'foo.sqsh' is not a registry reference; expected docker://"),
    ("oci://x", "'oci://x' is not a registry reference"),
    ("docker://", "image name '' is not valid"),
    ("docker://Ubuntu", "image name 'Ubuntu' is not valid"),
    ("docker://ubuntu:", "tag '' is not valid"),
    ("docker://ubuntu:bad/tag!", "image name 'ubuntu:bad/tag!' is not valid"),
    ("docker://reg_istry#img", "registry 'reg_istry' is not HOST[:PORT]"),
    ("docker://img@sha256:abc", "digest 'sha256:abc' is not sha256: and 64"),
    ("docker://a b@img", "user 'a b' is not valid"),
])
def test_malformed_references_say_what_was_expected(uri, message):
    with pytest.raises(BerthError) as error:
        parse(uri)
    assert message in str(error.value)
    assert "docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]" in str(error.value)


@pytest.mark.parametrize("uri, name", [
    ("docker://nvcr.io#nvidia/cuda:12.9", "nvidia+cuda+12.9.sqsh"),
    ("docker://ubuntu", "ubuntu.sqsh"),
    ("docker://bob@reg:5000#a/b:c", "a+b+c.sqsh"),
    (f"docker://busybox@{DIGEST}", f"busybox@sha256+{'ab' * 32}.sqsh"),
])
def test_default_output(uri, name):
    assert default_output(uri) == name


def test_registry_without_hash_is_explained():
    ref = parse("docker://nvcr.io/nvidia/cuda:12.9")
    assert ref.registry == "registry-1.docker.io"
    assert "for registry nvcr.io write docker://nvcr.io#nvidia/cuda:12.9" in ref.registry_hint()
    assert parse("docker://nvidia/cuda").registry_hint() == ""
    assert parse("docker://nvcr.io#nvidia/cuda").registry_hint() == ""


@pytest.mark.parametrize("image, enroot", [
    ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
    ("registry.local:5000/a/b", "registry.local:5000#a/b"),
    ("localhost/app:1", "localhost#app:1"),
    ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
    ("nvidia/cuda:12.9", "nvidia/cuda:12.9"),       # Docker Hub, in both forms
    ("ubuntu:24.04", "ubuntu:24.04"),
    ("docker-archive:/srv/a.tar", "docker-archive:/srv/a.tar"),  # a scheme, no HOST:PORT
    ("oci-archive:dir.x/a.tar", "oci-archive:dir.x/a.tar"),
])
def test_a_reference_written_for_docker_names_its_registry_as_enroot_does(image, enroot):
    assert in_enroot_form(image) == enroot

