"""SIF files (Apptainer's and Singularity's images), read where they lie.

A SIF file is a 128-byte global header, a table of fixed-size descriptors
and the data objects they point at. What Berth runs is the primary system
partition, a squashfs that squashfuse and unsquashfs read in place at its
offset: nothing is extracted or copied. Every number in the file is taken
as a claim to check against the file's size before it is used: a hostile
file is refused in one line, never read beyond its end. Signatures are
reported (by key fingerprint), not verified.
"""

import os
import struct
import time
from typing import NamedTuple

from berth.errors import BerthError
from berth.image.imageconfig import SQUASHFS_MAGIC, goarch

MAGIC = b"SIF_MAGIC\0"
MAGIC_OFFSET = 32  # after the launch line ("#!/usr/bin/env run-singularity")

# launch line, magic, version, architecture, uuid, then eight int64: creation
# and modification times, free and total descriptors, the descriptors'
# offset and length, the data's offset and length
_HEADER = struct.Struct("<32s10s3s3s16s8q")
# data type, used, id, group, link, offset, size, size with padding, two
# times, uid, gid, name, type-specific "extra" bytes
_DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
_PARTITION = struct.Struct("<ii3s")  # in "extra": filesystem, partition type, arch
_SIGNATURE = struct.Struct("<i20s")  # in "extra": hash, the key's v4 fingerprint
_SQUASHFS_HEAD = struct.Struct("<4s36xQ")  # squashfs magic; bytes_used at byte 40

_VERSION = b"01\0"
_DATA_PARTITION, _DATA_SIGNATURE, _DATA_JSON = 0x4004, 0x4005, 0x4006
# How a SIF image kept in a registry (Apptainer's `push oras://`) says so:
# its manifest's config and its one layer, the SIF file (Singularity before
# 3.7 wrote the layer's type misspelt, and some tools the config's without +json)
CONFIG_TYPES = ("application/vnd.sylabs.sif.config.v1+json", "application/vnd.sylabs.sif.config.v1")
LAYER_TYPES = ("application/vnd.sylabs.sif.layer.v1.sif", "appliciation/vnd.sylabs.sif.layer.tar")

# The name of the JSON object Berth adds to a SIF file its image cache keeps
# (pulled from a registry): the source and digest a squashfs image keeps in
# its image.json.
RECORD_NAME = b"berth-image.json"
_UNGROUPED = 0xF0000000  # the group of an object in none
_RECORD_MAX = 65536
_DATA_TYPES = {0x4001: "definition file", 0x4002: "environment", 0x4003: "labels",
               0x4006: "JSON metadata", 0x4007: "generic data", 0x4008: "cryptographic message",
               0x4009: "SBOM", 0x400a: "OCI root index", 0x400b: "OCI blob"}
_FILESYSTEMS = {1: "squashfs", 2: "ext3", 3: "archive", 4: "raw", 5: "encrypted squashfs"}
_SQUASHFS, _ENCRYPTED = 1, 5
_PARTITION_TYPES = {1: "system", 2: "primary system", 3: "data", 4: "overlay"}
_PRIMARY_SYSTEM = 2
_HASHES = {1: "SHA-256", 2: "SHA-384", 3: "SHA-512", 4: "BLAKE2s-256", 5: "BLAKE2b-256"}
# the format's architecture codes, named as Go names them (as Apptainer shows them)
ARCHES = {"01": "386", "02": "amd64", "03": "arm", "04": "arm64", "05": "ppc64",
          "06": "ppc64le", "07": "mips", "08": "mipsle", "09": "mips64", "10": "mips64le",
          "11": "s390x", "12": "riscv64"}
# Apptainer's tools make 48 descriptors; no header makes Berth read more than this many
MAX_DESCRIPTORS = 4096


class Image(NamedTuple):
    """What a SIF file holds, as far as Berth uses it."""
    offset: int          # of the primary system partition (a squashfs)
    size: int            # its length in bytes
    arch: str            # as ARCHES names it
    signatures: list     # (hash name, key fingerprint in hex) of each signature object
    objects: list        # a short description of every data object, in order
    record: tuple        # (offset, length) of Berth's JSON record, or None


def has_magic(head):
    """Whether `head` (the first bytes of a file) starts a SIF file."""
    return head[MAGIC_OFFSET:MAGIC_OFFSET + len(MAGIC)] == MAGIC


def read(fd, name):
    """The Image of the SIF file open as `fd` (a regular file); `name` is the
    file as the user named it, for the one-line refusals."""
    size = os.fstat(fd).st_size

    def refuse(reason):
        return BerthError(f"{name}: {reason}")

    head = os.pread(fd, _HEADER.size, 0)
    if len(head) < _HEADER.size:
        raise refuse("not a SIF image: shorter than a SIF header (truncated?)")
    _, magic, version, _, _, _, _, _, total, table, _, _, _ = _HEADER.unpack(head)
    if magic != MAGIC:
        raise refuse("not a SIF image")
    if version != _VERSION:
        raise refuse(f"SIF version {_text(version)!r}: Berth reads version 01")
    if not 0 <= total <= MAX_DESCRIPTORS:
        raise refuse(f"SIF header: {total} descriptors (at most {MAX_DESCRIPTORS} are read)")
    if table < _HEADER.size or table + total * _DESCRIPTOR.size > size:
        raise refuse(f"SIF header: its descriptor table (byte {table}, {total} entries) "
                     f"lies outside the {size}-byte file (truncated?)")
    raw = os.pread(fd, total * _DESCRIPTOR.size, table)
    if len(raw) < total * _DESCRIPTOR.size:
        raise refuse("SIF descriptor table: shorter than its header says (truncated?)")
    partitions, signatures, objects, record = [], [], [], None
    for entry in _DESCRIPTOR.iter_unpack(raw):
        kind, used, number, _, _, offset, length = entry[:7]
        object_name, extra = entry[12].rstrip(b"\0"), entry[13]
        if not used:
            continue
        if offset < 0 or length < 0 or offset + length > size:
            raise refuse(f"SIF object {number}: bytes {offset}..{offset + length} lie outside "
                         f"the {size}-byte file (truncated or corrupted)")
        if kind == _DATA_PARTITION:
            filesystem, part_type, arch = _PARTITION.unpack_from(extra)
            arch_name = ARCHES.get(_text(arch), f"unknown ({_text(arch)!r})")
            partitions.append((number, offset, length, filesystem, part_type, arch_name))
            objects.append(f"{_PARTITION_TYPES.get(part_type, 'unknown')} partition "
                           f"({_FILESYSTEMS.get(filesystem, 'unknown filesystem')}, "
                           f"{arch_name}, {length} bytes)")
        elif kind == _DATA_JSON and object_name == RECORD_NAME and length <= _RECORD_MAX:
            record = (offset, length)
            objects.append(f"Berth's record ({length} bytes)")
        elif kind == _DATA_SIGNATURE:
            hash_type, fingerprint = _SIGNATURE.unpack_from(extra)
            signatures.append((_HASHES.get(hash_type, "unknown hash"), fingerprint.hex().upper()))
            objects.append(f"signature ({signatures[-1][0]})")
        else:
            objects.append(f"{_DATA_TYPES.get(kind, f'data object of type {kind:#x}')} "
                           f"({length} bytes)")
    primary = [p for p in partitions if p[4] == _PRIMARY_SYSTEM]
    if not primary:
        held = ", ".join(objects) or "no data objects"
        raise refuse(f"no primary system partition to run (it holds: {held})")
    if len(primary) > 1:
        raise refuse(f"{len(primary)} primary system partitions: a SIF image has one")
    number, offset, length, filesystem, _, arch = primary[0]
    if filesystem == _ENCRYPTED:
        raise refuse("its system partition is encrypted: Berth does not decrypt SIF images")
    if filesystem != _SQUASHFS:
        raise refuse(f"its system partition is {_FILESYSTEMS.get(filesystem, 'of an unknown kind')}"
                     ": Berth runs squashfs partitions only")
    if arch != goarch():
        raise refuse(f"built for {arch}; this node is {goarch()}")
    squashfs = os.pread(fd, _SQUASHFS_HEAD.size, offset)
    whole = len(squashfs) == _SQUASHFS_HEAD.size and length >= _SQUASHFS_HEAD.size
    squash_magic, used = _SQUASHFS_HEAD.unpack(squashfs) if whole else (b"", 0)
    if squash_magic != SQUASHFS_MAGIC or not 0 < used <= length:
        raise refuse(f"SIF object {number}: not a whole squashfs (corrupted or truncated)")
    return Image(offset, length, arch, signatures, objects, record)


def read_record(fd, image):
    """Berth's JSON record of the SIF file open as `fd` (its Image), as text,
    or None when it has none."""
    if image.record is None:
        return None
    offset, length = image.record
    return os.pread(fd, length, offset).decode("utf-8", "replace")


def add_record(fd, name, text):
    """Append Berth's JSON record `text` to the SIF file open read-write as
    `fd` (a copy Berth made, checked by read()), in its first free
    descriptor, as siftool adds an object; one line naming `name` when the
    table is full."""
    head = os.pread(fd, _HEADER.size, 0)
    fields = list(_HEADER.unpack(head))
    free, total, table = fields[7], fields[8], fields[9]
    raw = os.pread(fd, total * _DESCRIPTOR.size, table)
    entries = list(_DESCRIPTOR.iter_unpack(raw))
    slot = next((i for i, entry in enumerate(entries) if not entry[1]), None)
    if slot is None:
        raise BerthError(f"{name}: no free SIF descriptor left to record where it came from")
    data = text.encode()
    offset = os.fstat(fd).st_size
    now = int(time.time())
    number = max((entry[2] for entry in entries if entry[1]), default=0) + 1
    descriptor = _DESCRIPTOR.pack(_DATA_JSON, 1, number, _UNGROUPED, 0, offset, len(data),
                                  len(data), now, now, 0, 0, RECORD_NAME, b"")
    os.pwrite(fd, data, offset)
    os.pwrite(fd, descriptor, table + slot * _DESCRIPTOR.size)
    fields[6] = now                      # modified
    fields[7] = max(free - 1, 0)         # free descriptors
    fields[10] = max(fields[10], (slot + 1) * _DESCRIPTOR.size)  # descriptors' length
    fields[12] = offset + len(data) - fields[11]  # data's length, from its offset
    os.pwrite(fd, _HEADER.pack(*fields), 0)


def _text(field):
    return field.rstrip(b"\0").decode("ascii", "replace")

