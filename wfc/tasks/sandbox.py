"""Run untrusted Python (model-written code) in a separate, confined process: :func:`run_python`.

What is enforced, on every run (Linux):

- **Time**: a wall-clock deadline (the whole process group is SIGKILLed) and ``RLIMIT_CPU`` (SIGXCPU at the soft
  limit, SIGKILL one second later).
- **Memory**: ``RLIMIT_AS`` per process (allocations beyond it fail: Python raises ``MemoryError``).
- **Files**: ``RLIMIT_FSIZE`` per file written (writes beyond it fail with EFBIG: Python ignores SIGXFSZ),
  ``RLIMIT_NOFILE``, no core dumps; a fresh working directory (inside a private parent, so ``..`` is not writable),
  removed afterwards; stdin is ``/dev/null``; no inherited file descriptors (``close_fds``).
- **Environment**: the program sees a minimal environment (``PATH``, ``HOME``/``TMPDIR`` = its directory, ``LANG``),
  never the host's variables, and runs ``python -I`` (ignores ``PYTHON*`` variables, user site, cwd on sys.path).
- **Process cleanup**: the sandbox starts a new session; when the program ends or the deadline passes, the whole
  process group is SIGKILLed, so background children die with it.
- **Output**: stdout and stderr are drained continuously and capped (``max_output_bytes`` each, the rest dropped).

What is enforced when the host permits it (each reported in :class:`SandboxResult`):

- ``network_namespace``: a new network namespace (``unshare(CLONE_NEWNET)``; needs root with CAP_SYS_ADMIN or
  unprivileged user namespaces). It has no usable interface, so every connection fails, to 127.0.0.1 too.
- ``sockets_blocked``: a seccomp filter (with ``no_new_privs``) refuses ``socket(2)`` for every address family,
  ``io_uring_setup`` and ``pidfd_getfd`` with EACCES, and every syscall of a foreign ABI (x86_64 and aarch64; other
  machines go without). ``socketpair(2)`` still works. It needs no privilege, so it is the network layer of hosts
  without namespaces (a default Docker container), and a second one elsewhere: a namespace alone does not stop a
  connection to a world-writable unix socket file. ``network_isolated`` is true when either layer is in place.
- ``pid_isolated``: a new PID namespace whose PID 1 is the sandbox's own ``init``; when it exits, the kernel kills
  every process the program started, even ones that called ``setsid()`` to leave the process group. Without it,
  such an escaped process survives the group kill.
- ``privileges_dropped``: when the host runs as root, the program runs as ``nobody`` (uid/gid 65534, no
  supplementary groups). Only then does ``RLIMIT_NPROC`` stop fork bombs (the kernel exempts uid 0 from it), and only
  then are root-only files (the host's private temp dirs, ``/proc/<pid>/environ`` of host processes) out of reach.
  This needs an interpreter that ``nobody`` can execute; :func:`sandbox_python` picks one. When the host is not root
  the program runs as the host's user, to which ``RLIMIT_NPROC`` applies anyway; its namespaces then come with a user
  namespace, which also puts the host's processes out of ptrace reach (``/proc/<pid>/environ``, ``mem``, ``fd``).

Threat model: the program is model-written Python that may, by accident or by reward hacking, do anything Python
can. No Python syntax is blocked (walking ``object.__subclasses__()``, fresh ``__builtins__``, ``importlib.reload``
and ``ctypes`` all reach ``os`` and libc); what is contained is the *effect*. Which layer contains which escape
(``tests/tasks/test_sandbox_escapes.py`` runs each with and without namespaces):

=====================================================  ============================================================
escape                                                 contained by
=====================================================  ============================================================
read the host's secrets: ``os.environ``, the          the minimal environment (always); the host's
environ of self and parent, ``/proc/<host pid>/        ``/proc/<pid>/*``: ``nobody`` (root host) or the user
environ`` or ``mem``                                   namespace (non-root host)
forge the report, read/write runner or init memory     ``PR_SET_DUMPABLE=0`` on runner and init (always; a root
                                                       program keeps CAP_SYS_PTRACE)
write/chmod/delete host files, the host's cwd,         ``nobody`` (root host); the private 0711 outer dir for
``..``; inherited descriptors                          ``..``; ``close_fds`` for descriptors (always)
connect to loopback TCP, abstract or file unix         network namespace and/or the socket filter
sockets, by any import trick or a raw syscall
kill the host, its other processes, ``kill(-1)``       PID namespace (host pids do not exist inside; init, PID 1,
                                                       ignores SIGKILL from inside) and/or ``nobody``
fork / ``subprocess`` / shell bombs                    ``RLIMIT_NPROC`` (``nobody`` or a non-root host), the group
                                                       kill and the PID namespace for cleanup
memory bomb, endless loop, endless output              ``RLIMIT_AS`` per process, ``RLIMIT_CPU`` per process and the
                                                       deadline, the output cap (always)
segfaults and ``ctypes`` memory writes                 a separate process: status ``crashed`` (always)
=====================================================  ============================================================

What is **not** prevented: reading world-readable files; writing wherever the program's user may write (as
``nobody``: world-writable dirs such as ``/tmp``, each file capped by ``RLIMIT_FSIZE``, left behind after the run);
without a PID namespace, signalling processes of the same user (as ``nobody``: other sandboxes, including by
``kill(-1)``; a killed ``init`` is reported as ``crashed``); CPU contention and total memory (no cgroups: a run may
hold ``max_processes`` times ``memory_bytes``). ``RLIMIT_NPROC`` counts every process of the user on the machine,
so concurrent sandboxes share it, and without a PID namespace so do the killed processes of earlier runs until the
host's PID 1 reaps them (a second or two after a fork bomb): a run that cannot start for it is retried with
backoff (``BUSY_RETRIES``; without, 64 concurrent runs lost 23 to it), and is ``crashed`` if it still cannot.
Hosts with neither root nor namespaces get none of the process and file layers: the program runs as the host's
user, next to it. A root host whose interpreter ``nobody`` cannot run gets no file or ``/proc`` layer (the program
is root). This is a guard against accidents and sloppy or reward-hacking model output, not a security boundary
against a determined attacker (kernel exploits are out of scope): use a VM or gVisor for that.

Mechanics: the host starts ``sandbox_runner.py`` (no ``preexec_fn``, so :func:`run_python` is safe to call from
several threads at once); the runner applies the limits, enters the namespaces, drops privileges, makes itself
undumpable, installs the socket filter and reports what it achieved on a private pipe (see its docstring). Linux
only.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NOBODY = 65534
RUNNER = Path(__file__).with_name("sandbox_runner.py")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
PROGRAM_FILE = "main.py"
BUSY_RETRIES = 12  # starts refused for the shared process limit, retried with backoff (~5 s in all) before "crashed"
_CHUNK = 65536

Status = Literal["passed", "failed", "timeout", "crashed", "killed"]
# Signals by which the kernel enforces our limits; any other fatal signal means the program crashed.
_LIMIT_SIGNALS = {
    signal.SIGXCPU: "CPU time limit",
    signal.SIGXFSZ: "file size limit",
    signal.SIGKILL: "SIGKILL (CPU hard limit or out of memory)",
}


class SandboxLimits(BaseModel):
    """Resource limits for one run. Frozen; build a new one with ``limits.model_copy(update={...})``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="wall-clock deadline for the whole run")
    cpu_s: int = Field(10, ge=1, description="RLIMIT_CPU per process, seconds")
    memory_bytes: int = Field(1 << 30, ge=64 << 20, description="RLIMIT_AS per process (Python needs ~30 MB)")
    max_processes: int = Field(64, ge=4, description="RLIMIT_NPROC, counting the sandbox's 3 own processes")
    max_file_bytes: int = Field(16 << 20, ge=0, description="RLIMIT_FSIZE: largest file the program may write")
    max_open_files: int = Field(256, ge=16, description="RLIMIT_NOFILE")
    max_output_bytes: int = Field(10_000, ge=0, description="bytes of stdout and of stderr kept, each")
    isolate_network: bool = Field(True, description="a network namespace where permitted, and the socket filter")
    namespaces: bool = Field(True, description="try network/PID namespaces; False tests the layers left without")
    drop_privileges: bool = True


class SandboxResult(BaseModel):
    """What happened to one program.

    ``status``: ``passed`` (exit code 0), ``failed`` (nonzero exit code: an exception, a failed assert, a syntax
    error), ``timeout`` (the wall-clock deadline passed; the group was killed), ``killed`` (a limit signal:
    SIGXCPU, SIGXFSZ, SIGKILL), ``crashed`` (any other fatal signal, or the sandbox itself failed; see ``reason``).
    ``returncode`` follows :mod:`subprocess`: the exit code, or ``-N`` for signal N, ``None`` on timeout.
    """

    model_config = ConfigDict(frozen=True)

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    network_isolated: bool = Field(description="network_namespace or sockets_blocked: no connection can be made")
    network_namespace: bool
    sockets_blocked: bool = Field(description="the seccomp filter refusing socket(2) is in place")
    pid_isolated: bool
    privileges_dropped: bool
    reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _usable_by_others(path: str) -> bool:
    """Whether a user with no special rights can reach ``path`` (every parent o+x) and read/execute it."""
    p = Path(os.path.realpath(path))
    try:
        for parent in reversed(p.parents):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(p).st_mode
    except OSError:
        return False
    needed = stat.S_IXOTH | stat.S_IROTH if p.is_dir() else stat.S_IXOTH
    return mode & needed == needed


def sandbox_python() -> tuple[str, bool]:
    """The interpreter for sandboxed programs and whether it can run as ``nobody`` (needed to drop root).

    Prefers ``sys.executable`` (same version as the host) when ``nobody`` can run it and read its standard
    library; else the first system ``python3`` that ``nobody`` can run; else ``sys.executable`` as is.
    Programs run on the stdlib only either way (``-I``: no user site; a system Python has no project packages).
    """
    stdlib = os.path.dirname(os.__file__)
    if _usable_by_others(sys.executable) and _usable_by_others(stdlib):
        return sys.executable, True
    for candidate in SYSTEM_PYTHONS:
        if os.path.exists(candidate) and _usable_by_others(candidate):
            return candidate, True
    return sys.executable, False


def _rlimits(limits: SandboxLimits) -> dict[str, list[int]]:
    return {
        "CPU": [limits.cpu_s, limits.cpu_s + 1],
        "AS": [limits.memory_bytes, limits.memory_bytes],
        "NPROC": [limits.max_processes, limits.max_processes],
        "FSIZE": [limits.max_file_bytes, limits.max_file_bytes],
        "NOFILE": [limits.max_open_files, limits.max_open_files],
        "CORE": [0, 0],
    }


def _minimal_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.kept, self.total = cap, bytearray(), 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the runner a zombie: its pid, and so our process group id, cannot be reused until we reap it.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _pump(proc: subprocess.Popen, captures: dict, deadline: float) -> bool:
    """Drain stdout/stderr into ``captures`` until both close, or the runner exits, or ``deadline`` passes.

    Returns True when the deadline passed. A pipe can stay open after the runner exits (a grandchild that left the
    group still holds it), so the runner's exit also ends the loop, after a short grace to collect buffered output.
    """
    sel = selectors.DefaultSelector()
    for stream, capture in captures.items():
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ, capture)
    grace_until = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return True
            if grace_until is None and _exited(proc.pid):
                grace_until = now + 0.2
            if grace_until is not None and now >= grace_until:
                return False
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
                try:
                    chunk = os.read(key.fd, _CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    key.data.feed(chunk)
                else:  # EOF: every process holding this pipe has closed it
                    sel.unregister(key.fileobj)
        return False
    finally:
        sel.close()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_runner(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait (without reaping) for the runner to exit; True if the deadline passed first."""
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.005)
    return False


def _read_report(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    data = bytearray()
    try:
        while chunk := os.read(fd, _CHUNK):
            data += chunk
    except BlockingIOError:
        pass
    events = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return events


def _classify(events: list[dict], runner_code: int | None, timed_out: bool) -> tuple[Status, int | None, str | None]:
    if timed_out:
        return "timeout", None, "wall-clock deadline passed"
    for event in events:
        if event.get("event") == "error":
            return "crashed", runner_code, event.get("message")
        if event.get("event") == "exit":
            code = event["code"]
            return ("passed" if code == 0 else "failed"), code, None
        if event.get("event") == "signal":
            sig = event["signal"]
            if sig in _LIMIT_SIGNALS:
                return "killed", -sig, _LIMIT_SIGNALS[sig]
            return "crashed", -sig, f"killed by {signal.Signals(sig).name}"
    return "crashed", runner_code, "the sandbox runner ended without a report"


def _make_workdir(parent: str | None, owner: int | None) -> tuple[str, str]:
    """A private outer dir (only traversable by others) holding the program's working dir.

    The outer dir keeps ``..`` of the working dir unwritable for the program, whatever ``parent`` allows.
    """
    outer = tempfile.mkdtemp(prefix="wfc-sandbox-", dir=parent)
    os.chmod(outer, 0o711)
    work = os.path.join(outer, "work")
    os.mkdir(work, 0o700)
    if owner is not None:
        os.chown(work, owner, owner)
    return outer, work


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o700)  # the program may have chmod-ed its own dirs read-only
        func(p)

    shutil.rmtree(path, onerror=make_writable_and_retry)


def run_python(
    code: str,
    *,
    limits: SandboxLimits | None = None,
    python: str | None = None,
    workdir_parent: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh directory under the limits; return what happened.

    ``python`` defaults to :func:`sandbox_python`; an explicit one is used as is (privileges are dropped only if
    ``nobody`` can run it). ``workdir_parent`` is where the temporary directory goes (default: the system temp dir;
    it must be traversable by ``nobody`` when privileges are dropped). Never raises for anything the program does;
    raises ``TypeError`` for a non-string ``code``.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python needs the program as a str, got {type(code).__name__}")
    limits = limits or SandboxLimits()
    if python is None:
        python, runnable_by_nobody = sandbox_python()
    else:
        runnable_by_nobody = _usable_by_others(python)
    drop = limits.drop_privileges and os.geteuid() == 0 and runnable_by_nobody
    outer, work = _make_workdir(workdir_parent, NOBODY if drop else None)
    try:
        program = os.path.join(work, PROGRAM_FILE)
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        if drop:
            os.chown(program, NOBODY, NOBODY)
        jitter = random.Random()
        for attempt in range(BUSY_RETRIES + 1):
            result, busy = _run_in(work, python, limits, drop)
            if not busy or attempt == BUSY_RETRIES:
                return result
            # Concurrent sandboxes share the user's RLIMIT_NPROC: a start refused for it (before the program ran,
            # so nothing of it happened) waits for others to end, backing off with jitter so waiters spread out.
            time.sleep(min(0.02 * 2 ** attempt, 0.5) * (0.5 + jitter.random()))
        return result
    finally:
        _remove_tree(outer)


def _run_in(work: str, python: str, limits: SandboxLimits, drop: bool) -> tuple[SandboxResult, bool]:
    """One run of the program in ``work``: (what happened, busy). ``busy``: the runner could not fork for the
    user's process limit before the program started (see :func:`run_python`'s retries)."""
    report_r, report_w = os.pipe()
    config = {
        "python": python,
        "argv": [python, "-I", PROGRAM_FILE],
        "env": _minimal_env(work),
        "rlimits": _rlimits(limits),
        "isolate_network": limits.isolate_network,
        "namespaces": limits.namespaces,
        "uid": NOBODY if drop else None,
        "gid": NOBODY if drop else None,
        "report_fd": report_w,
    }
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(RUNNER), json.dumps(config)],
            cwd=work,
            env=_minimal_env(work),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            pass_fds=(report_w,),
            start_new_session=True,
        )
    finally:
        os.close(report_w)
    captures = {proc.stdout: _Capture(limits.max_output_bytes), proc.stderr: _Capture(limits.max_output_bytes)}
    try:
        timed_out = _pump(proc, captures, deadline) or _wait_runner(proc, deadline)
    finally:
        _kill_group(proc.pid)  # the runner is alive or a zombie here, so this group id is still ours
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    duration = time.monotonic() - start
    try:
        events = _read_report(report_r)
    finally:
        os.close(report_r)
    setup = next((e for e in events if e.get("event") == "setup"), {})
    status, returncode, reason = _classify(events, proc.returncode, timed_out)
    out, err = captures[proc.stdout], captures[proc.stderr]
    busy = status == "crashed" and any(e.get("event") == "error" and e.get("busy") for e in events)
    return SandboxResult(
        status=status,
        returncode=returncode,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.total > len(out.kept),
        stderr_truncated=err.total > len(err.kept),
        duration_s=duration,
        network_isolated=bool(setup.get("network_namespace") or setup.get("sockets_blocked")),
        network_namespace=bool(setup.get("network_namespace", False)),
        sockets_blocked=bool(setup.get("sockets_blocked", False)),
        pid_isolated=bool(setup.get("pid_isolated", False)),
        privileges_dropped=bool(setup.get("privileges_dropped", False)),
        reason=reason,
    ), busy
