"""The seccomp filter of every container process, as enroot and pyxis install it.

In a user namespace only the caller's own uid and gid exist, so a package
manager acting as root (dpkg's `chown root:shadow`, an `adduser` in a
postinst, `setgroups` before dropping privileges) fails on calls that make
no sense there. The filter makes them succeed without doing anything:

  chown, fchown, lchown, fchownat, setuid, setgid, setreuid, setregid,
  setresuid, setresgid, setgroups          return 0, no effect
  setfsuid, setfsgid                       the same, unless the argument is
                                           -1 (a query: the kernel answers)

Every other call, and every call of another ABI (i386 or arm32 compat
binaries), is left alone. It is a convenience for fake roots, not a
restriction: nothing is refused. It is a classic BPF program installed with
PR_SET_NO_NEW_PRIVS and PR_SET_SECCOMP (no libseccomp needed); it is
inherited by every child and across execve, and /proc/PID/status then says
`Seccomp: 2`. The syscall numbers are known for x86_64 (x32 calls too) and
aarch64; on any other architecture no filter is installed (`install`
returns False) and such calls fail as they would without it.

A process that joins a running container (berth exec, or the SPANK
plugin's tasks, which setns into the keeper's namespaces) is no child of
the keeper: it must install the same filter itself before its exec.
"""

import ctypes
import os

from berth import syscalls as sc

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_FAKED = {
    "x86_64": {"chown": 92, "fchown": 93, "lchown": 94, "setuid": 105, "setgid": 106,
               "setreuid": 113, "setregid": 114, "setgroups": 116, "setresuid": 117,
               "setresgid": 119, "fchownat": 260},
    # asm-generic numbering: no chown/lchown (fchownat does both)
    "aarch64": {"fchownat": 54, "fchown": 55, "setregid": 143, "setgid": 144,
                "setreuid": 145, "setuid": 146, "setresuid": 147, "setresgid": 149,
                "setgroups": 159},
}
_FS_IDS = {"x86_64": {"setfsuid": 122, "setfsgid": 123},
           "aarch64": {"setfsuid": 151, "setfsgid": 152}}
_X32_BIT = 0x40000000

# classic BPF opcodes and seccomp return values
_LD_W_ABS, _JEQ_K, _AND_K, _RET_K = 0x20, 0x15, 0x54, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
# offsets in struct seccomp_data: nr, arch, then args[0] (its low half: both
# architectures are little-endian)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def program(machine):
    """The filter for `machine` as (code, jt, jf, k) tuples, or None when unknown."""
    if machine not in _AUDIT_ARCH:
        return None
    faked, fs_ids = _FAKED[machine].values(), _FS_IDS[machine].values()
    head = [(_LD_W_ABS, 0, 0, _ARCH), ("jne", _AUDIT_ARCH[machine], "allow"),
            (_LD_W_ABS, 0, 0, _NR)]
    if machine == "x86_64":  # x32 calls: the same numbers with a high bit set
        head.append((_AND_K, 0, 0, 0xFFFFFFFF & ~_X32_BIT))
    body = [("jeq", nr, "fake") for nr in sorted(faked)]
    body += [("jeq", nr, "fs_id") for nr in sorted(fs_ids)]
    # Jumps go forward only: head, body, then "allow" for everything that
    # fell through, the -1 test of setfsuid/setfsgid, "fake", "allow".
    listing = head + body + [(_RET_K, 0, 0, _RET_ALLOW)]
    labels = {"fs_id": len(listing)}
    listing += [(_LD_W_ABS, 0, 0, _ARG0_LOW), ("jeq", 0xFFFFFFFF, "allow")]
    labels["fake"] = len(listing)
    listing.append((_RET_K, 0, 0, _RET_ERRNO | 0))
    labels["allow"] = len(listing)
    listing.append((_RET_K, 0, 0, _RET_ALLOW))
    code = []
    for index, item in enumerate(listing):
        if isinstance(item[0], str):  # a jump to a label; the other way falls through
            kind, k, label = item
            offset = labels[label] - index - 1
            code.append((_JEQ_K, 0, offset, k) if kind == "jne" else (_JEQ_K, offset, 0, k))
        else:
            code.append(item)
    return code


def install():
    """Install the filter in this process (and so in all it execs); False when
    the architecture is unknown. PR_SET_NO_NEW_PRIVS comes first, as the
    kernel requires of a process without CAP_SYS_ADMIN."""
    code = program(os.uname().machine)
    if code is None:
        return False
    instructions = (_Instruction * len(code))(*(_Instruction(*i) for i in code))
    prog = _Program(len(code), instructions)
    sc.prctl(PR_SET_NO_NEW_PRIVS, 1)
    sc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))
    return True


# `python3 -m berth.container.seccomp [MACHINE]`: the program as C initializers
if __name__ == "__main__":
    import sys
    listing = program(sys.argv[1] if len(sys.argv) > 1 else os.uname().machine)
    if listing is None:
        sys.exit("berth.seccomp: no filter for this architecture")
    for code, jt, jf, k in listing:
        print(f"{{ 0x{code:02x}, {jt}, {jf}, 0x{k:08x} }},")
