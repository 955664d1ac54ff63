"""A seccomp filter for the jails: system calls a solution has no use for fail with EPERM.

Namespaces bound what a solution can reach; the kernel's own code is still all in reach, and a
bug there is an escape. This filter narrows that surface to what programs that compute need. It
denies: debugging other processes (ptrace, process_vm_*, kcmp), kernel keyrings, eBPF, perf
events, userfaultfd and io_uring (frequent sources of kernel exploits), every mount and namespace
call (mount, the new mount API, pivot_root, chroot, unshare, setns: the jail is set up before the
filter applies), file handles (open_by_handle_at), modules, kexec, reboot, swap, accounting,
syslog, quotas, vhangup and personality. Other architectures' and the x32 ABI's calls are refused
outright. Built by hand as classic BPF (`struct sock_filter`), handed to bubblewrap with
`--seccomp FD`, which applies it to the runner and everything it starts.

Only x86_64 is covered (the machines this project runs and tests on); elsewhere `program()`
returns None and the jail runs without the filter (a warning says so).
"""
from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06

DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "add_key": 248, "request_key": 249, "keyctl": 250,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "syslog": 103, "quotactl": 179,
    "vhangup": 153, "personality": 135,
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter for this machine, as bytes of `struct sock_filter[]`; None where none is defined."""
    if platform.machine() != "x86_64":
        return None
    denied = sorted(set(DENIED_X86_64.values()))
    # layout: [load arch, arch check, load nr, x32 check, one check per denied call, ALLOW, ERRNO, KILL]
    n = len(denied)
    allow = 4 + n
    deny, kill = allow + 1, allow + 2
    out = [_insn(LD_W_ABS, 0, 0, 4),                                   # A = seccomp_data.arch
           _insn(JEQ_K, 0, kill - 2, AUDIT_ARCH_X86_64),               # another ABI: kill
           _insn(LD_W_ABS, 0, 0, 0),                                   # A = seccomp_data.nr
           _insn(JGE_K, deny - 4, 0, X32_SYSCALL_BIT)]                 # x32 calls: refused
    for i, nr in enumerate(denied):
        pos = 4 + i
        out.append(_insn(JEQ_K, deny - pos - 1, 0, nr))
    out += [_insn(RET_K, 0, 0, RET_ALLOW), _insn(RET_K, 0, 0, RET_ERRNO | errno.EPERM),
            _insn(RET_K, 0, 0, RET_KILL_PROCESS)]
    return b"".join(out)
