"""The child-side half of :mod:`wfc.tasks.sandbox`: confine this process, then run the untrusted program.

Run as ``python -I -S sandbox_runner.py CONFIG_JSON`` by :func:`wfc.tasks.sandbox.run_python`, never imported by
it. Stdlib only, because it runs before (and outside) anything the project installs.

Process tree (all in one new session, which the host kills as a group when it is done)::

    runner   sets limits, enters namespaces, drops privileges, forks:
      init   PID 1 of the new PID namespace (when permitted): forks the program, reaps orphans, reports
        program   execs the interpreter on the untrusted file

``init`` exists so that the program gets ordinary signal semantics (the kernel ignores default-action signals such
as SIGXCPU sent to a namespace's PID 1) and so that everything the program spawns dies with ``init``: when a PID
namespace's PID 1 exits, the kernel kills every other process in it, even ones that left the session.

Report protocol: JSON lines on the file descriptor ``config["report_fd"]``, in this order:

- ``{"event": "setup", "network_namespace": bool, "pid_isolated": bool, "privileges_dropped": bool,
  "sockets_blocked": bool}``
- then exactly one of ``{"event": "exit", "code": int}``, ``{"event": "signal", "signal": int}`` (the program's
  fate), or ``{"event": "error", "message": str}`` (the sandbox itself failed; the program may not have run).

Config keys: ``python``, ``argv``, ``env``, ``rlimits`` (name -> [soft, hard]), ``isolate_network`` (bool: a network
namespace where permitted, and the socket filter), ``namespaces`` (bool: try namespaces at all), ``uid``/``gid`` (ints
to switch to, or null), ``report_fd``.

Order matters: limits, then namespaces (mapping ids needs a dumpable process), then the drop to ``nobody``, then
``PR_SET_DUMPABLE=0`` (so that the program, even under the same uid, cannot open ``/proc/<runner or init>/fd/N``
and write a forged report, nor read their memory), then the seccomp filter (it also sets ``no_new_privs``: setuid
binaries give the program nothing), then the fork of ``init``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
SETUP_FAILED = 125

# seccomp-bpf: (audit arch, syscalls to refuse) per machine. socket(2) for every family (socketpair(2) stays:
# asyncio and multiprocessing pipes use it, and it cannot reach anything outside); io_uring_setup (IORING_OP_SOCKET
# would bypass the socket filter); pidfd_getfd (copying another process' socket).
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {"socket": 41, "io_uring_setup": 425, "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, {"socket": 198, "io_uring_setup": 425, "pidfd_getfd": 438}),
}
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI numbers its syscalls from here: refuse them all
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO, _EACCES = 0x7FFF0000, 0x00050000, 13


def apply_rlimits(rlimits: dict[str, list[int]]) -> None:
    """Set each ``RLIMIT_<name>`` to (soft, hard). Limits are inherited by every process forked afterwards."""
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (soft, hard))


def _map_ids_to_self(uid: int, gid: int) -> None:
    # After an unprivileged unshare(CLONE_NEWUSER) our ids are unmapped (files we create would fail with EOVERFLOW);
    # mapping each id to itself keeps the process the same user it was, just without host capabilities.
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def enter_namespaces(libc, *, isolate_network: bool) -> tuple[bool, bool]:
    """Unshare network and PID namespaces, as many as the kernel permits; return (network_isolated, pid_isolated).

    As root this needs CAP_SYS_ADMIN; otherwise it needs unprivileged user namespaces, which many hosts disable.
    A new network namespace has only a loopback device, and it is down: every connect() fails, 127.0.0.1 included.
    """
    as_root = os.geteuid() == 0
    user_flag = 0 if as_root else CLONE_NEWUSER
    attempts = [(CLONE_NEWNET | CLONE_NEWPID, True, True), (CLONE_NEWNET, True, False)] if isolate_network else []
    attempts.append((CLONE_NEWPID, False, True))
    uid, gid = os.getuid(), os.getgid()
    for flags, network, pid in attempts:
        if libc.unshare(flags | user_flag) == 0:
            if user_flag:
                _map_ids_to_self(uid, gid)
            return network, pid
    return False, False


def socket_filter(machine: str) -> bytes | None:
    """The seccomp-bpf program (packed ``struct sock_filter`` array) refusing the syscalls of ``_SECCOMP_ARCH`` with
    EACCES, and every syscall made under another ABI (i386 ``int 0x80``, x32); None for an unknown machine."""
    if machine not in _SECCOMP_ARCH:
        return None
    arch, numbers = _SECCOMP_ARCH[machine]
    # seccomp_data: int nr at offset 0, u32 arch at offset 4. Jump offsets count instructions after the current one.
    denied = sorted(numbers.values())
    checks = [(_BPF_JGE_K, _X32_SYSCALL_BIT)] if machine == "x86_64" else []
    checks += [(_BPF_JEQ_K, nr) for nr in denied]
    prog = [(_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 0, len(checks) + 2, arch), (_BPF_LD_W_ABS, 0, 0, 0)]
    for i, (op, k) in enumerate(checks):
        prog.append((op, len(checks) - i, 0, k))  # true: jump to the final "deny"
    prog += [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | _EACCES)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def block_sockets(libc) -> bool:
    """Install :func:`socket_filter` on this process (inherited by every child, kept across exec); return whether
    it is in place. The fallback for hosts without a network namespace, and a second layer where there is one."""
    program = socket_filter(os.uname().machine)
    if program is None:
        return False

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // 8, program)
    zero = ctypes.c_ulong(0)  # the kernel wants the unused arguments 0 in all 64 bits
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero, zero, zero) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), zero, zero) == 0


def drop_privileges(uid: int | None, gid: int | None) -> bool:
    """Switch to (uid, gid) with no supplementary groups when we are root; return whether we switched."""
    if uid is None or os.geteuid() != 0:
        return False
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    return True


def _die_with_parent(libc) -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _run_init(libc, config: dict, send) -> int:
    """PID 1 of the namespace: start the program, reap everything, report the program's fate."""
    _die_with_parent(libc)
    program = os.fork()
    if program == 0:
        try:
            _die_with_parent(libc)
            os.execve(config["python"], config["argv"], config["env"])
        except BaseException as e:  # exec failed: tell the user through stderr, never return into init's code
            os.write(2, f"sandbox: could not start {config['python']}: {e}\n".encode())
        finally:
            os._exit(127)
    while True:  # as PID 1 we also inherit the program's orphans; reap them until the program itself is done
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        send(event="signal", signal=sig)
        return 128 + sig
    code = os.waitstatus_to_exitcode(status)
    send(event="exit", code=code)
    return code


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    report_fd = config["report_fd"]
    os.set_inheritable(report_fd, False)  # the interpreter we exec must not be able to forge reports

    def send(**event) -> None:
        os.write(report_fd, (json.dumps(event) + "\n").encode())

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        apply_rlimits(config["rlimits"])
        network, pid_ns = False, False
        if config.get("namespaces", True):
            network, pid_ns = enter_namespaces(libc, isolate_network=config["isolate_network"])
        dropped = drop_privileges(config["uid"], config["gid"])
        if libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
        blocked = block_sockets(libc) if config["isolate_network"] else False
    except Exception as e:  # noqa: BLE001 - any setup failure is reported, the program never runs unconfined
        send(event="error", message=f"sandbox setup failed: {e!r}")
        return SETUP_FAILED
    send(event="setup", network_namespace=network, pid_isolated=pid_ns, privileges_dropped=dropped,
         sockets_blocked=blocked)
    try:
        init = os.fork()
    except OSError as e:
        send(event="error", message=f"sandbox could not fork: {e!r}", busy=isinstance(e, BlockingIOError))
        return SETUP_FAILED
    if init == 0:
        code = SETUP_FAILED
        try:
            code = _run_init(libc, config, send)
        except BaseException as e:  # noqa: BLE001
            # busy: a fork refused with EAGAIN before the program started (the user's RLIMIT_NPROC is shared with
            # concurrent sandboxes); the host may run it again
            send(event="error", message=f"sandbox init failed: {e!r}", busy=isinstance(e, BlockingIOError))
        finally:
            os._exit(code & 0xFF)
    _, status = os.waitpid(init, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv))
