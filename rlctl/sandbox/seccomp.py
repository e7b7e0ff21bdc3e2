"""The seccomp filter of the terminal sandbox: a classic-BPF program, assembled here, that bubblewrap loads
(`--seccomp FD`) just before it starts the command, so it binds every process of the sandbox.

Why assembled here rather than with libseccomp: the filter is a short, fixed list of comparisons, the kernel's
BPF format is stable, and doing it in thirty lines of Python avoids a native dependency (python3-seccomp is
packaged for Debian's own interpreter only). The program:

1. a system call of another architecture (the i386 entry of an x86_64 kernel) kills the process;
2. on x86_64, an x32 system call (number with bit 30 set) gets EPERM;
3. each system call of BLOCKED gets EPERM: kernel surfaces a command never needs and that escapes and
   privilege-escalation exploits use (tracing other processes, mounts, keyrings, BPF, perf, module and kexec
   loading, io_uring, userfaultfd, new namespaces);
4. `clone` with any CLONE_NEW* flag gets EPERM (threads and forks pass); `clone3`, whose flags are behind a
   pointer the filter cannot read, gets ENOSYS, so the C library falls back to `clone`;
5. `socket` and `socketpair` of any address family but UNIX, IPv4 and IPv6 get EAFNOSUPPORT (what a kernel
   without that family answers, so programs fall back as they would there): vsock would reach the hypervisor's
   host, netlink the kernel's routing and audit surfaces, packet and others raw frames, none of which a command
   needs (its network is the gate's, netgate.py);
6. everything else is allowed.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

# <linux/filter.h> and <linux/seccomp.h>
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian: args[0]'s low word first)

CLONE_NEW_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000
# <linux/socket.h>: the only address families a sandboxed socket may have
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)

BLOCKED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "open_by_handle_at",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
)


@dataclass(frozen=True)
class Arch:
    audit: int  # AUDIT_ARCH_* of <linux/audit.h>
    numbers: dict[str, int]  # system call numbers of this architecture
    x32: bool = False


# Numbers from the kernel's syscall tables (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/
# unistd.h for arm64); iopl and ioperm exist on x86 only.
ARCHES = {
    "x86_64": Arch(
        0xC000003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "move_mount": 429,
            "open_tree": 428,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 272,
            "setns": 308,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "acct": 163,
            "quotactl": 179,
            "syslog": 103,
            "open_by_handle_at": 304,
            "settimeofday": 164,
            "clock_settime": 227,
            "clock_adjtime": 305,
            "adjtimex": 159,
            "iopl": 172,
            "ioperm": 173,
            "clone": 56,
            "clone3": 435,
            "socket": 41,
            "socketpair": 53,
        },
        x32=True,
    ),
    "aarch64": Arch(
        0xC00000B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "move_mount": 429,
            "open_tree": 428,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 97,
            "setns": 268,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "acct": 89,
            "quotactl": 60,
            "syslog": 116,
            "open_by_handle_at": 265,
            "settimeofday": 170,
            "clock_settime": 112,
            "clock_adjtime": 266,
            "adjtimex": 171,
            "clone": 220,
            "clone3": 435,
            "socket": 198,
            "socketpair": 199,
        },
    ),
}


def native_arch() -> Arch | None:
    """The table of the machine the service runs on; None where there is none (no filter can be made)."""
    return ARCHES.get(platform.machine())


class _Program:
    """A list of BPF instructions with forward jumps to named labels, resolved when packed."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def pack(self) -> bytes:
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.code):
            jumps = [self.labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if not all(0 <= jump <= 255 for jump in jumps):
                raise ValueError("seccomp program: jump out of range")
            out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
        return bytes(out)


def build_filter(arch: Arch) -> bytes:
    """The filter as `struct sock_filter[]` bytes (what bwrap's --seccomp reads)."""
    program = _Program()
    program.op(_LD_W_ABS, _ARCH)
    program.op(_JEQ_K, arch.audit, jt=1)
    program.op(_RET_K, RET_KILL_PROCESS)
    program.op(_LD_W_ABS, _NR)
    if arch.x32:
        program.op(_JGE_K, X32_SYSCALL_BIT, jt="deny")
    for name in BLOCKED:
        if name in arch.numbers:
            program.op(_JEQ_K, arch.numbers[name], jt="deny")
    program.op(_JEQ_K, arch.numbers["clone"], jt="clone")
    program.op(_JEQ_K, arch.numbers["clone3"], jt="enosys")
    program.op(_JEQ_K, arch.numbers["socket"], jt="socket")
    program.op(_JEQ_K, arch.numbers["socketpair"], jt="socket")
    program.op(_RET_K, RET_ALLOW)
    program.label("socket")  # the family is args[0], an int: its low word is all the kernel reads
    program.op(_LD_W_ABS, _ARG0_LOW)
    for family in ALLOWED_FAMILIES:
        program.op(_JEQ_K, family, jt="allow")  # BPF jumps only forward: the allowing return follows
    program.op(_RET_K, RET_ERRNO | errno.EAFNOSUPPORT)
    program.label("allow")
    program.op(_RET_K, RET_ALLOW)
    program.label("clone")
    program.op(_LD_W_ABS, _ARG0_LOW)
    program.op(_JSET_K, CLONE_NEW_FLAGS, jt="deny")
    program.op(_RET_K, RET_ALLOW)
    program.label("enosys")
    program.op(_RET_K, RET_ERRNO | errno.ENOSYS)
    program.label("deny")
    program.op(_RET_K, RET_ERRNO | errno.EPERM)
    return program.pack()
