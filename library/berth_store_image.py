#!/usr/bin/python
"""Ansible module: put registry images into Berth's shared image store ahead of the jobs."""

DOCUMENTATION = r"""
---
module: berth_store_image
short_description: Pre-stage registry images in Berth's shared image store
description:
  - Resolves each image of O(images) to the digest its tag names now, as the
    SPANK plugin does once per job at submission (C(berth import --resolve)),
    and asks the store's socket to import that pinned reference when the store
    has no entry for it yet. The first job of the image then finds it there,
    and no node waits for the registry.
  - C(changed) only when an image was imported, that is, when it is new or its
    tag has moved since the last run. Check mode resolves the tags and reports
    which images would be pulled, and pulls nothing.
  - The store pulls anonymously, so only images the registry gives anyone can
    be staged; a private image fails, named. So does a tag the registry does
    not know.
  - A store that answers busy (the user the module runs as has used its share
    of the store) fails saying so, apart from an import that failed; a later
    run stages the image.
  - Run it on one node with the store's socket (C(run_once)), since the store is one
    filesystem for the whole cluster.
version_added: "0.1.0"
options:
  images:
    description:
      - Registry references as C(--container-image) takes them,
        C([docker://][REGISTRY#]IMAGE[:TAG|@DIGEST]), without C(USER@);
        C(docker://) is added where no scheme is given.
    type: list
    elements: str
    required: true
  berth:
    description: The C(berth) program.
    type: path
    default: /usr/local/bin/berth
  socket:
    description: The store's socket, C(BERTH_IMAGE_STORE_SOCKET) in C(enroot.conf).
    type: path
    default: /run/berth-store.sock
  timeout:
    description:
      - Seconds the exchange with the store about one image may take, from
        the connect to the end of its answer. Past it the module fails naming
        the image; the store's own import goes on (within its service's time
        limit), so a later run finds it there or waits again.
    type: int
    default: 7200
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
requirements:
  - Berth's runtime with C(BERTH_IMAGE_STORE) set in C(enroot.conf), and the
    store's socket listening (the C(container_runtime) role sets up both)
author:
  - Berth authors
"""

EXAMPLES = r"""
- name: Pre-stage the images most jobs run
  berth_store_image:
    images:
      - nvcr.io#nvidia/pytorch:24.01-py3
      - docker://ubuntu:24.04
  run_once: true
"""

RETURN = r"""
pulled:
  description: The pinned references imported into the store (in check mode, those it would import).
  returned: always
  type: list
  elements: str
  sample: ["docker://nvcr.io#nvidia/pytorch@sha256:4f2a..."]
present:
  description: The pinned references the store held already.
  returned: always
  type: list
  elements: str
resolved:
  description: Each image of O(images) and the pinned reference its tag named.
  returned: always
  type: dict
  sample: {"nvcr.io#nvidia/pytorch:24.01-py3": "docker://nvcr.io#nvidia/pytorch@sha256:4f2a..."}
"""

import contextlib
import json
import socket
import time

from ansible.module_utils.basic import AnsibleModule

ANSWER_MAX = 8192  # "ok " and a path; the store answers no more

# The store pulls without credentials; so does the resolve, or an image the
# store cannot pull would resolve here and fail only at its import.
NO_CREDENTIALS = {"ENROOT_CONFIG_PATH": "/nonexistent/berth-store-image"}


def run_berth(module, *args):
    rc, out, err = module.run_command([module.params["berth"], *args],
                                      environ_update=NO_CREDENTIALS)
    if rc != 0:
        said = (err.strip() or out.strip() or f"exit status {rc}").splitlines()[-1]
        module.fail_json(msg=f"berth_store_image: berth {' '.join(args)}: {said}"[:2000])
    return out


def stored_sources(module):
    """The references the store's entries were imported from."""
    out = run_berth(module, "store", "list", "--json")
    try:
        return {entry["source"] for entry in json.loads(out)}
    except (ValueError, TypeError, KeyError) as e:
        module.fail_json(msg=f"berth_store_image: berth store list --json: not a list of "
                             f"entries ({e}): {out[:200]!r}")


# The store's protocol (runtime/berth/store/service.py), read by the same rules
# as the runtime's client (store/client.py), which this module cannot import:
# berth lives in its own venv, maybe of another Python than the module's.
def ask_store(path, reference, timeout):
    """The store's one-line answer to a request for `reference` (None when
    it closed without one). The whole exchange, from the connect to the last
    read, within `timeout` seconds (TimeoutError past it); ValueError for
    an answer that is not one line of text."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        with contextlib.suppress(OSError):  # (an early answer is read all the same)
            sock.settimeout(remaining(deadline))
            sock.sendall(reference.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
        return read_answer(sock, deadline)


def remaining(deadline):
    return max(deadline - time.monotonic(), 0.001)


def read_answer(sock, deadline):
    data = b""
    while b"\n" not in data:
        sock.settimeout(remaining(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > ANSWER_MAX:
            raise ValueError(f"more than {ANSWER_MAX} bytes")
    if not data:
        return None
    line, _, rest = data.partition(b"\n")
    text = line.decode("utf-8", "replace")
    if rest or not text.isprintable():
        raise ValueError(f"{data[:100]!r}, not one line")
    return text


def answer_problem(answer):
    """What is wrong with the store's `answer`, as the module says it; None for ok."""
    if answer is None:
        return "the store closed without answering"
    kind, _, reason = answer.partition(" ")
    if kind == "ok":
        return None
    if kind == "private":
        return ("the registry wants a login; the store pulls anonymously, so only public "
                "images can be staged")
    if kind == "busy":  # the store's share of this user is taken: nothing failed
        return f"the store is busy ({reason}); a later run stages it"
    if kind == "error":
        return f"the store failed to import it: {reason}"
    return f"the store answered {answer[:100]!r}, not ok, private, busy or error"


def stage(module, image, pinned):
    timeout = module.params["timeout"]
    try:
        answer = ask_store(module.params["socket"], pinned, timeout)
    except TimeoutError:
        module.fail_json(msg=f"berth_store_image: {image}: the store gave no answer within "
                             f"{timeout} s (its import goes on; a later run finds it or waits "
                             "again)")
    except OSError as e:
        module.fail_json(msg=f"berth_store_image: {image}: the store's socket "
                             f"{module.params['socket']}: {e.strerror or e}")
    except ValueError as e:
        module.fail_json(msg=f"berth_store_image: {image}: the store answered {e}; refusing it")
    problem = answer_problem(answer)
    if problem is not None:
        module.fail_json(msg=f"berth_store_image: {image}: {problem}")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            images=dict(type="list", elements="str", required=True),
            berth=dict(type="path", default="/usr/local/bin/berth"),
            socket=dict(type="path", default="/run/berth-store.sock"),
            timeout=dict(type="int", default=7200),
        ),
        supports_check_mode=True,
    )
    if not 1 <= module.params["timeout"] <= 7 * 86400:
        module.fail_json(msg=f"berth_store_image: timeout: {module.params['timeout']} is not "
                             "between 1 and 604800 seconds")
    for image in module.params["images"]:
        if not image or not image.isprintable() or any(c.isspace() for c in image):
            module.fail_json(
                msg=f"berth_store_image: images: {image!r} is not a registry reference")
    resolved = {}
    for image in module.params["images"]:
        # as --container-image takes it: docker:// when no scheme is given
        uri = image if "://" in image else "docker://" + image
        resolved[image] = run_berth(module, "import", "--resolve", uri).strip()
    present = stored_sources(module)
    # each pinned image once, named by the first entry of images that resolved to it
    image_of = {pinned: image for image, pinned in reversed(resolved.items())}
    pulled = [pinned for pinned in dict.fromkeys(resolved.values()) if pinned not in present]
    result = dict(changed=bool(pulled), pulled=pulled,
                  present=sorted(set(resolved.values()) - set(pulled)), resolved=resolved,
                  diff=dict(before="", after="".join(f"{p}\n" for p in pulled),
                            before_header="image store", after_header="image store (pulled)"))
    if not module.check_mode:
        for pinned in pulled:
            stage(module, image_of[pinned], pinned)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
