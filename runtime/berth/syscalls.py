"""The Linux system calls Python's os module lacks, through ctypes.

One thin wrapper per call; each raises OSError with the errno and the
argument that failed, so callers can turn it into a message naming it.
"""

import ctypes
import os
import sys

# The C library Python itself runs on (find_library would spawn ldconfig).
_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_RELATIME = 0x200000
MS_PRIVATE = 0x40000
MS_SLAVE = 0x80000
MS_SHARED = 0x100000
MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522

# glibc has no wrapper for this: numbers per architecture.
_SYSCALL_NUMBERS = {
    "x86_64": {"pivot_root": 155},
    "aarch64": {"pivot_root": 41},
    "ppc64le": {"pivot_root": 203},
}


def _check(result, what):
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(name, *args):
    machine = os.uname().machine
    numbers = _SYSCALL_NUMBERS.get(machine)
    if numbers is None:
        raise OSError(0, f"{name}: unsupported architecture {machine}")
    return _check(_libc.syscall(ctypes.c_long(numbers[name]), *args), name)


def unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd, nstype=0):
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


#: What no directory named in overlay's mount options may hold: ',' ends an
#: option, ':' a lower directory, '\\' escapes them (fuse-overlayfs, which
#: stands in for the kernel's overlay, reads no escapes).
OVERLAY_UNSAFE = ",:\\"


def overlay_unsafe(path):
    """Whether `path` cannot be named in overlay's options (OVERLAY_UNSAFE)."""
    return any(c in path for c in OVERLAY_UNSAFE)


def mount(source, target, fstype=None, flags=0, data=None):
    def enc(s):
        return None if s is None else os.fsencode(s)
    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


def umount2(target, flags=0):
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root, put_old):
    _syscall("pivot_root", os.fsencode(new_root), os.fsencode(put_old))


# struct ifreq: the interface's name (16 bytes), then (for these requests)
# its flags; 40 bytes in all
_IFREQ_SIZE = 40
_IFREQ_FLAGS = 16
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_AF_INET = 2
_SOCK_DGRAM_CLOEXEC = 2 | 0o2000000


def interface_up(name):
    """Set interface `name` of this net namespace up (ioctl SIOCSIFFLAGS).
    Through libc: it runs after pivot_root, where no Python module is left
    to import."""
    fd = _check(_libc.socket(_AF_INET, _SOCK_DGRAM_CLOEXEC, 0), "socket")
    try:
        request = ctypes.create_string_buffer(name.encode(), _IFREQ_SIZE)
        _check(_libc.ioctl(fd, _SIOCGIFFLAGS, request), f"SIOCGIFFLAGS {name}")
        flags = int.from_bytes(request.raw[_IFREQ_FLAGS:_IFREQ_FLAGS + 2], sys.byteorder)
        ctypes.memmove(ctypes.addressof(request) + _IFREQ_FLAGS,
                       (flags | _IFF_UP).to_bytes(2, sys.byteorder), 2)
        _check(_libc.ioctl(fd, _SIOCSIFFLAGS, request), f"SIOCSIFFLAGS {name}")
    finally:
        os.close(fd)


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    args = (ctypes.c_ulong(a) for a in (arg2, arg3, arg4, arg5))
    return _check(_libc.prctl(ctypes.c_int(option), *args), "prctl")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _set_inheritable(keep):
    """Make the inheritable capabilities the permitted ones (`keep`) or none."""
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = half.permitted if keep else 0
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def keep_capabilities_across_exec():
    """Raise every permitted capability into the ambient set: programs this
    process runs keep them even as a uid other than 0 (in a user namespace,
    capabilities there only). Undone by drop_ambient_capabilities."""
    _set_inheritable(True)
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        last = int(f.read())
    for cap in range(last + 1):
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap)


def drop_ambient_capabilities():
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _set_inheritable(False)


def pid_alive(pid):
    """Whether a process `pid` exists (another user's counts: EPERM)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (past any pid: a name that says 9999999999)
        return False
    except OSError:
        return True
    return True
