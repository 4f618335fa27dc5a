"""berth_store_image: what it pulls, idempotence, a moved tag, check mode and refusals.

`berth` here is a small stand-in (tags and the store's entries in JSON files)
and the store's socket a thread of this test answering one line per request;
the multinode scenario runs the module against the real runtime, the real
socket unit and a real registry (molecule/multinode/tests/test_image_store.py)."""

import contextlib
import json
import socket
import textwrap
import threading
import time

import pytest

import ansible_module

FAKE_BERTH = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    here = os.path.dirname(sys.argv[0])
    tags = json.load(open(os.path.join(here, "tags.json")))
    entries = json.load(open(os.path.join(here, "entries.json")))
    args = sys.argv[1:]
    if os.environ.get("ENROOT_CONFIG_PATH") != "/nonexistent/berth-store-image":
        sys.exit("berth: the test expects no credentials to be read")
    if args[:2] == ["import", "--resolve"]:
        if not args[2].startswith("docker://"):
            sys.exit(f"berth: error: '{args[2]}' is not a registry reference")
        image = args[2][len("docker://"):]
        if image not in tags:
            sys.exit(f"berth: {image}: manifest unknown")
        print("docker://" + image.split(":")[0] + "@" + tags[image])
    elif args == ["store", "list", "--json"] and os.path.exists(os.path.join(here, "list.out")):
        print(open(os.path.join(here, "list.out")).read())
    elif args == ["store", "list", "--json"]:
        print(json.dumps([{"path": f"/shared/images/{n}.sqsh", "size": 1, "used": 0,
                           "source": source, "latest": True}
                          for n, source in enumerate(entries)]))
    else:
        sys.exit("unexpected: " + " ".join(args))
""")


class Store:
    """The store's socket: answers `ok PATH` and records the entry, or what `answers` says."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.path = str(tmp_path / "store.sock")
        self.requests = []
        self.answers = {}
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = conn.makefile("rb").readline().decode().rstrip("\n")
                self.requests.append(request)
                answer = self.answers.get(request, "ok /shared/images/new.sqsh")
                if answer is None:  # a store whose import takes longer than the module waits
                    time.sleep(3)
                    continue
                if isinstance(answer, list):  # an answer in pieces, each after a pause
                    with contextlib.suppress(OSError):  # (the module may have given up)
                        for piece in answer:
                            time.sleep(0.4)
                            conn.sendall(piece.encode())
                    continue
                if answer.startswith("ok"):
                    self.add(request)
                conn.sendall(answer.encode() + b"\n")

    def add(self, source):
        entries = json.loads((self.dir / "entries.json").read_text())
        (self.dir / "entries.json").write_text(json.dumps(entries + [source]))

    def close(self):
        self.server.close()


@pytest.fixture
def store(tmp_path):
    berth = tmp_path / "berth"
    berth.write_text(FAKE_BERTH)
    berth.chmod(0o755)
    (tmp_path / "entries.json").write_text("[]")
    tag("registry#a/b:1", "sha256:" + "1" * 64, tmp_path)
    store = Store(tmp_path)
    yield store
    store.close()


def tag(image, digest, directory):
    path = directory / "tags.json"
    tags = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**tags, image: digest}))


def module_args(tmp_path, store, images, **options):
    return {"images": images, "berth": str(tmp_path / "berth"), "socket": store.path, **options}


def run(tmp_path, store, images, check=False, **options):
    return ansible_module.call_module("berth_store_image", module_args(tmp_path, store, images, **options),
                                      check)


@pytest.fixture
def play_dir(tmp_path):
    (tmp_path / "play").mkdir()
    return tmp_path


@pytest.mark.playbook
def test_pulls_the_pinned_image_once_then_changes_nothing(play_dir, store):
    pinned = "docker://registry#a/b@sha256:" + "1" * 64
    first = ansible_module.run_module(play_dir / "play", "berth_store_image",
                                      module_args(play_dir, store, ["registry#a/b:1"]))
    assert first["changed"] and first["pulled"] == [pinned]
    assert first["resolved"] == {"registry#a/b:1": pinned}
    assert store.requests == [pinned]
    again = ansible_module.run_module(play_dir / "play", "berth_store_image",
                                      module_args(play_dir, store, ["registry#a/b:1"]))
    assert not again["changed"] and again["present"] == [pinned] and again["pulled"] == []
    assert store.requests == [pinned]


def test_a_moved_tag_is_pulled_again_and_check_mode_only_lists_it(play_dir, store):
    run(play_dir, store, ["registry#a/b:1"])
    tag("registry#a/b:1", "sha256:" + "2" * 64, play_dir)
    moved = "docker://registry#a/b@sha256:" + "2" * 64
    check = run(play_dir, store, ["registry#a/b:1"], check=True)
    assert check["changed"] and check["pulled"] == [moved]
    assert check["diff"]["after"] == moved + "\n"
    assert moved not in store.requests
    result = run(play_dir, store, ["registry#a/b:1"])
    assert result["changed"] and store.requests[-1] == moved


@pytest.mark.parametrize("listing", ["  1.5G  2026-11-25 01:00  docker://registry#a/b:1  /x.sqsh",
                                     '{"source": "docker://registry#a/b:1"}', '[{"path": "/x"}]'])
def test_a_listing_that_is_not_a_list_of_entries_fails_before_any_pull(play_dir, store, listing):
    (play_dir / "list.out").write_text(listing)
    result = run(play_dir, store, ["registry#a/b:1"])
    assert result["failed"] and store.requests == []
    assert result["msg"].startswith("berth_store_image: berth store list --json: not a list of "
                                    "entries ("), result["msg"]


def test_a_private_image_fails_naming_it(play_dir, store):
    tag("registry#secret/x:1", "sha256:" + "3" * 64, play_dir)
    store.answers["docker://registry#secret/x@sha256:" + "3" * 64] = "private 401 from registry"
    result = run(play_dir, store, ["registry#secret/x:1"])
    assert result["failed"]
    assert result["msg"] == ("berth_store_image: registry#secret/x:1: the registry wants a login; "
                             "the store pulls anonymously, so only public images can be staged")


def test_an_unknown_tag_fails_naming_it_before_any_pull(play_dir, store):
    result = run(play_dir, store, ["registry#a/b:1", "registry#a/b:nope"])
    assert result["failed"]
    assert result["msg"] == ("berth_store_image: berth import --resolve docker://registry#a/b:nope: "
                             "berth: registry#a/b:nope: manifest unknown")
    assert store.requests == []


def test_no_socket_fails_naming_it(play_dir, store):
    store.close()
    (play_dir / "store.sock").unlink()
    result = run(play_dir, store, ["registry#a/b:1"])
    assert result["failed"]
    assert result["msg"] == (f"berth_store_image: registry#a/b:1: the store's socket "
                             f"{store.path}: No such file or directory")


def test_a_store_that_does_not_answer_fails_after_the_timeout(play_dir, store):
    """The play waited as long as the store's import ran (up to its
    service's six hours) for each image."""
    store.answers["docker://registry#a/b@sha256:" + "1" * 64] = None
    result = run(play_dir, store, ["registry#a/b:1"], timeout=1)
    assert result["failed"]
    assert result["msg"] == ("berth_store_image: registry#a/b:1: the store gave no answer within "
                             "1 s (its import goes on; a later run finds it or waits again)")
    for bad in (0, -5, 10**12):
        result = run(play_dir, store, ["registry#a/b:1"], timeout=bad)
        assert result["failed"] and result["msg"] == (
            f"berth_store_image: timeout: {bad} is not between 1 and 604800 seconds")


def test_a_store_answering_by_trickles_fails_when_the_whole_exchange_is_past_the_timeout(
        play_dir, store):
    # Each piece comes well within the timeout; the answer as a whole does
    # not: ten pieces 0.4 s apart, cut at 1 s, long before the last (the
    # bound leaves the module's own start room on a busy machine).
    pieces = ["o", "k", " /", "a", "b", "c", "d", "e", ".sqsh", "\n"]
    store.answers["docker://registry#a/b@sha256:" + "1" * 64] = pieces
    started = time.monotonic()
    result = run(play_dir, store, ["registry#a/b:1"], timeout=1)
    assert result["failed"] and result["msg"] == (
        "berth_store_image: registry#a/b:1: the store gave no answer within 1 s (its import "
        "goes on; a later run finds it or waits again)")
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("answer, said", [
    ("busy alice holds 4 connections on this node",
     "the store is busy (alice holds 4 connections on this node); a later run stages it"),
    ("error registry#a/b: blocked by registries.conf",
     "the store failed to import it: registry#a/b: blocked by registries.conf"),
    ("", "the store answered '', not ok, private, busy or error"),
    ("fine", "the store answered 'fine', not ok, private, busy or error"),
    ("ok /x.sqsh\nok /y.sqsh", "the store answered b'ok /x.sqsh\\nok /y.sqsh\\n', not one line; "
                                "refusing it"),
    ("ok " + "x" * 9000, "the store answered more than 8192 bytes; refusing it"),
])
def test_each_answer_but_ok_fails_saying_what_the_store_meant(play_dir, store, answer, said):
    store.answers["docker://registry#a/b@sha256:" + "1" * 64] = answer
    result = run(play_dir, store, ["registry#a/b:1"])
    assert result["failed"] and result["msg"] == f"berth_store_image: registry#a/b:1: {said}"


def test_a_store_that_closes_without_answering_fails_saying_so(play_dir, store):
    store.answers["docker://registry#a/b@sha256:" + "1" * 64] = []
    result = run(play_dir, store, ["registry#a/b:1"])
    assert result["failed"] and result["msg"] == (
        "berth_store_image: registry#a/b:1: the store closed without answering")


def test_a_reference_with_spaces_is_refused(play_dir, store):
    result = run(play_dir, store, ["registry#a/b:1 --rm"])
    assert result["failed"]
    assert result["msg"] == "berth_store_image: images: 'registry#a/b:1 --rm' is not a registry reference"
    assert store.requests == []


def test_two_names_of_one_image_are_pulled_once(play_dir, store):
    tag("registry#a/b:latest", "sha256:" + "1" * 64, play_dir)
    pinned = "docker://registry#a/b@sha256:" + "1" * 64
    result = run(play_dir, store, ["registry#a/b:1", "registry#a/b:latest"])
    assert result["changed"] and result["pulled"] == [pinned]
    assert store.requests == [pinned]
