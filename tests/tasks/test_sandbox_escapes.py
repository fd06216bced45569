"""Known escapes of Python code-execution harnesses, run against wfc.tasks.sandbox: the *effect* must be contained.

The sandbox blocks no Python syntax, so every Python-level trick (walking ``object.__subclasses__()``, fresh
``__builtins__``, ``ctypes``) reaches ``os`` and libc; what is tested is that the host survives, its secrets stay
unread, its files untouched and its sockets unreached. Every test runs in two modes: ``namespaces`` (the default:
network and PID namespaces where the host permits them) and ``no-namespaces`` (``SandboxLimits(namespaces=False)``,
what a host without CAP_SYS_ADMIN or user namespaces, such as a default Docker container, gets). Each test names
the layer that must contain the escape in that mode (see the table in :mod:`wfc.tasks.sandbox`); where no layer
applies on this host it skips and says which documented gap it hit, and it never runs an uncontained attack.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from wfc.tasks.sandbox import SandboxLimits, SandboxResult, run_python

SMALL = SandboxLimits(
    timeout_s=3.0, cpu_s=1, memory_bytes=256 << 20, max_processes=16, max_file_bytes=1 << 20, max_output_bytes=10_000
)
ROOT = os.geteuid() == 0
_layers: dict[bool, SandboxResult] = {}


@pytest.fixture(params=[True, False], ids=["namespaces", "no-namespaces"])
def mode(request, sandbox_parent) -> SandboxLimits:
    """The limits of one mode; the first use runs an empty program to learn which layers this host grants."""
    limits = SMALL.model_copy(update={"namespaces": request.param})
    if request.param not in _layers:
        _layers[request.param] = run_python("pass", limits=limits, workdir_parent=sandbox_parent)
    return limits


def layers(limits: SandboxLimits) -> SandboxResult:
    return _layers[limits.namespaces]


def run(code: str, limits: SandboxLimits, parent: str, **overrides) -> SandboxResult:
    limits = limits.model_copy(update=overrides) if overrides else limits
    result = run_python(code, limits=limits, workdir_parent=parent)
    probe = layers(limits)
    assert (result.network_namespace, result.sockets_blocked, result.pid_isolated, result.privileges_dropped) == (
        probe.network_namespace, probe.sockets_blocked, probe.pid_isolated, probe.privileges_dropped
    ), "the layers of one mode are the same on every run"
    return result


def other_user(r: SandboxResult) -> bool:
    """Whether the host's processes are out of the program's reach (``/proc/<pid>/environ``, ``mem``, ptrace):
    it runs as ``nobody`` (root hosts), or in a user namespace (non-root hosts get one with their namespaces)."""
    return r.privileges_dropped or (not ROOT and (r.pid_isolated or r.network_namespace))


def require(condition: bool, gap: str) -> None:
    if not condition:
        pytest.skip(f"documented gap on this host: {gap}")


@pytest.fixture
def secret(monkeypatch) -> str:
    value = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("WFC_ESCAPE_SECRET", value)
    return value


@pytest.fixture
def precious(tmp_path) -> Path:
    """A file outside the sandbox that only permissions protect: its dir and it are world-readable."""
    folder = tmp_path / "outside"
    folder.mkdir()
    path = folder / "precious.txt"
    path.write_text("keep me")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    os.chmod(path, 0o644)
    return path


@pytest.fixture
def victim():
    """A process of the test's own user, for the program to try to kill."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def untouched(precious: Path) -> bool:
    return precious.read_text() == "keep me" and os.listdir(precious.parent) == [precious.name]


# --- Python-level routes to os: all of them reach it; what they do with it is contained -------------------------

ROUTES = {
    "import": "import os\nsystem = os.system",
    "subclasses-wrap_close": (
        "system = [c for c in ().__class__.__bases__[0].__subclasses__()\n"
        "          if c.__name__ == '_wrap_close'][0].__init__.__globals__['system']"
    ),
    "subclasses-catch_warnings": (
        "import warnings  # most harnesses have it loaded; then it is one of object's subclasses\n"
        "cw = [c for c in ().__class__.__bases__[0].__subclasses__() if c.__name__ == 'catch_warnings'][0]\n"
        "system = cw()._module.sys.modules['os'].system"
    ),
    "fresh-builtins-FunctionType": (
        "import types\n"
        "__builtins__ = {}  # a harness that strips builtins; restore them from any class's globals\n"
        "real = [c for c in ().__class__.__bases__[0].__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
        "b = real.__init__.__globals__['__builtins__']\n"
        "f = types.FunctionType(compile('import os; s = os.system', 'x', 'exec'), {'__builtins__': b})\n"
        "g = f.__globals__; f(); system = g['s']"
    ),
    "sys.modules-reload-__import__": (
        "import sys, importlib\n"
        "sys.modules['os'] = None  # a harness that poisons imports\n"
        "del sys.modules['os']\n"
        "posix = importlib.reload(__import__('posix'))\n"
        "system = posix.system"
    ),
    "ctypes-libc-system": "import ctypes\nsystem = lambda cmd: ctypes.CDLL(None).system(cmd.encode())",
}


@pytest.mark.parametrize("route", ROUTES)
def test_python_routes_to_os_cannot_touch_the_host(route, mode, sandbox_parent, precious, secret, victim):
    require(layers(mode).privileges_dropped, "the program runs as the host's user or root: it may write its files")
    host_cwd = os.getcwd()
    shell = (
        f"echo pwned > {precious}; echo pwned > {precious.parent}/new.txt; echo pwned > {host_cwd}/ESCAPED-{route};"
        f" cat /proc/{os.getpid()}/environ; kill -9 {victim.pid}; echo route-ran"
    )
    code = f"{ROUTES[route]}\nstatus = system({shell!r})\nprint('status', status)"
    r = run(code, mode, sandbox_parent)
    assert r.status == "passed", r.stderr
    assert "route-ran" in r.stdout, "the route did reach os.system"
    assert untouched(precious) and not Path(host_cwd, f"ESCAPED-{route}").exists()
    assert secret not in r.stdout + r.stderr
    assert victim.poll() is None


# --- signals ----------------------------------------------------------------------------------------------------


def test_signals_to_the_host_and_the_sandbox_parents(mode, sandbox_parent, victim):
    probe = layers(mode)
    require(other_user(probe) or probe.pid_isolated, "the program runs as the host's user with no PID namespace")
    targets = [victim.pid, os.getpid(), os.getppid(), -os.getpgid(0)]
    if probe.pid_isolated:  # without a PID namespace kill(-1) as nobody reaches other sandboxes (documented)
        targets.append(-1)
    code = f"""
import os, signal, time
for pid in {targets!r} + [os.getppid()]:
    try:
        os.kill(pid, signal.SIGKILL)
        print("sent", pid, flush=True)
    except OSError as e:
        print("refused", pid, type(e).__name__, flush=True)
time.sleep(0.2)  # the last kill was at our own parent: without a PID namespace we die with it (PDEATHSIG)
print("program still here")
"""
    r = run(code, mode, sandbox_parent)
    assert victim.poll() is None, "a process of the test's user survives"
    for pid in targets[:4]:  # ours: sent only where the pid means another process inside the namespace
        assert f"refused {pid} " in r.stdout or probe.pid_isolated, r.stdout
    if probe.pid_isolated:  # getppid() is init, PID 1 of the namespace: the kernel drops SIGKILL from inside
        assert r.status == "passed" and "program still here" in r.stdout
    else:  # init (same uid as the program) may die: the harness reports it, it does not hang or call it a pass
        assert r.status in ("passed", "crashed") and r.duration_s < SMALL.timeout_s
        if r.status == "crashed":
            assert "without a report" in r.reason or "SIGKILL" in r.reason


# --- /proc and the environment ----------------------------------------------------------------------------------


def test_environment_is_minimal_through_every_path(mode, sandbox_parent, secret):
    code = """
import os
print(dict(os.environ))
for path in ("/proc/self/environ", f"/proc/{os.getppid()}/environ", "/proc/1/environ"):
    try:
        print(path, open(path, "rb").read())
    except OSError as e:
        print(path, "refused", type(e).__name__)
"""
    r = run(code, mode, sandbox_parent)
    assert r.status == "passed", r.stderr
    assert secret not in r.stdout + r.stderr and "WFC_ESCAPE_SECRET" not in r.stdout
    environ = eval(r.stdout.splitlines()[0])  # noqa: S307 - our own program's repr of a dict of strs
    assert set(environ) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE"}


def test_host_proc_files_are_out_of_reach(mode, sandbox_parent, secret):
    require(other_user(layers(mode)), "the program runs as the host's user in the host's user namespace, or as root")
    me = os.getpid()
    code = f"""
import ctypes, os
for path in ("/proc/{me}/environ", "/proc/{me}/mem", "/proc/{me}/fd/0", "/proc/{os.getppid()}/environ"):
    try:
        print(path, open(path, "rb").read(4096))
    except OSError as e:
        print(path, "refused", type(e).__name__)
try:
    open("/proc/{me}/mem", "r+b")
    print("mem opened for writing")
except OSError as e:
    print("mem refused", type(e).__name__)
"""
    r = run(code, mode, sandbox_parent)
    assert r.status == "passed", r.stderr
    assert secret not in r.stdout + r.stderr
    assert r.stdout.count("refused") == 5, r.stdout


def test_runner_and_init_cannot_be_read_or_forged(mode, sandbox_parent):
    """The program finds its runner by cmdline (world-readable) and writes a fake "exit 0" into the report pipe,
    then fails: without PR_SET_DUMPABLE=0 this scored as a pass when the program ran as the runner's user."""
    code = r"""
import json, os
for pid in os.listdir("/proc"):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if any(a.endswith(b"sandbox_runner.py") for a in argv):
        fd = json.loads(argv[-2])["report_fd"]
        for path in (f"/proc/{pid}/fd/{fd}", f"/proc/{pid}/environ", f"/proc/{pid}/mem"):
            try:
                w = os.open(path, os.O_WRONLY)
                os.write(w, b'{"event": "exit", "code": 0}\n')
                print("forged through", path)
            except OSError as e:
                print("refused", path, type(e).__name__)
raise SystemExit(1)
"""
    r = run(code, mode, sandbox_parent)
    require(r.privileges_dropped or not ROOT, "the program runs as root: it has CAP_SYS_PTRACE over everything")
    assert "forged" not in r.stdout and r.stdout.count("refused") >= 3, r.stdout
    assert r.status == "failed" and r.returncode == 1


# --- files ------------------------------------------------------------------------------------------------------


def test_writing_outside_its_dir(mode, sandbox_parent, precious):
    require(layers(mode).privileges_dropped, "the program runs as the host's user or root: it may write its files")
    host_cwd = os.getcwd()
    held = os.open(precious, os.O_WRONLY | os.O_APPEND)
    os.set_inheritable(held, True)  # even a descriptor the host forgot to protect is not passed on
    code = f"""
import os
for path in ({str(precious)!r}, {str(precious.parent / "new.txt")!r}, {host_cwd + "/ESCAPED"!r},
             "../escaped", {sandbox_parent + "/escaped"!r}, "/proc/{os.getpid()}/cwd/ESCAPED"):
    try:
        open(path, "a").write("pwned")
        print("wrote", path)
    except OSError as e:
        print("refused", path, type(e).__name__)
for fd in range(3, 64):
    try:
        os.write(fd, b"pwned")
        print("wrote fd", fd)
    except OSError:
        pass
try:
    os.chmod({str(precious)!r}, 0o666)
    print("chmod-ed")
except OSError as e:
    print("refused chmod", type(e).__name__)
"""
    try:
        r = run(code, mode, sandbox_parent)
    finally:
        os.close(held)
    assert r.status == "passed", r.stderr
    assert "wrote" not in r.stdout and "chmod-ed" not in r.stdout, r.stdout
    assert untouched(precious) and os.stat(precious).st_mode & 0o777 == 0o644
    assert not Path(host_cwd, "ESCAPED").exists() and os.listdir(sandbox_parent) == []


# --- network ----------------------------------------------------------------------------------------------------


@pytest.fixture
def listeners(tmp_path):
    """A TCP server on loopback, an abstract unix socket and a world-writable unix socket file, all listening."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0wfc-escape-{uuid.uuid4().hex}")
    folder = tmp_path / "sock"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o777)
    filesystem = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filesystem.bind(str(folder / "s"))
    os.chmod(folder / "s", 0o777)
    servers = [tcp, abstract, filesystem]
    for server in servers:
        server.listen(8)
        server.setblocking(False)
    yield servers
    for server in servers:
        server.close()


def test_no_connection_reaches_the_host(mode, sandbox_parent, listeners):
    probe = layers(mode)
    require(probe.network_isolated, "neither a network namespace nor the socket filter (unknown machine)")
    tcp, abstract, filesystem = (s.getsockname() for s in listeners)
    code = f"""
import ctypes, importlib, socket, sys
def attempt(name, make, address):
    try:
        s = make()
        s.settimeout(1.0)
        s.connect(address)
        s.sendall(b"exfiltrated")
        print("connected", name)
    except OSError as e:
        print("blocked", name, type(e).__name__)
attempt("tcp", lambda: socket.socket(), {tcp!r})
attempt("abstract", lambda: socket.socket(socket.AF_UNIX), {abstract!r})
attempt("file", lambda: socket.socket(socket.AF_UNIX), {filesystem!r})
del sys.modules["socket"], sys.modules["_socket"]
fresh = importlib.reload(__import__("socket"))
attempt("reloaded", lambda: fresh.socket(), {tcp!r})
attempt("_socket", lambda: __import__("_socket").socket(), {tcp!r})
fd = ctypes.CDLL(None, use_errno=True).syscall(41 if ctypes.sizeof(ctypes.c_void_p) == 8 and
                                                 __import__("os").uname().machine == "x86_64" else 198, 2, 1, 0)
print("raw socket fd", fd)
if fd >= 0:
    attempt("raw", lambda: socket.socket(fileno=fd), {tcp!r})
"""
    r = run(code, mode, sandbox_parent)
    assert r.status == "passed", r.stderr
    assert "connected" not in r.stdout and r.stdout.count("blocked") >= 5, r.stdout
    for server in listeners:
        with pytest.raises(BlockingIOError):
            server.accept()
    if probe.sockets_blocked:
        assert "raw socket fd -1" in r.stdout, "the filter works on the syscall, whatever Python does"


# --- processes and resources -------------------------------------------------------------------------------------


def processes_of_run(home: str) -> set[int]:
    """Live pids whose environment says they belong to the run with this HOME (root reads every environ)."""
    needle = f"HOME={home}\0".encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                if "\nState:\tZ" not in (entry / "status").read_text():
                    pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def nobody_entries() -> set[int]:
    """Pids of ``nobody``, zombies included."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and "\nUid:\t65534\t" in (entry / "status").read_text():
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def wait_for_reaping(before: set[int], timeout: float = 5.0) -> None:
    """Wait until ``nobody`` has no processes beyond ``before``, zombies included: without a PID namespace a killed
    bomb's zombies wait for the host's PID 1 to reap them, and count against RLIMIT_NPROC for the next run."""
    deadline = time.monotonic() + timeout
    while nobody_entries() - before and time.monotonic() < deadline:
        time.sleep(0.05)


BOMBS = {
    "os.fork": "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "subprocess": (
        "import subprocess\nwhile True:\n    try:\n        subprocess.Popen(['sleep', '30'])\n"
        "    except OSError:\n        pass"
    ),
    "os.system-shell": "os.system('b() { b | b & }; b')",
}


@pytest.mark.parametrize("bomb", BOMBS)
def test_process_bombs_end_and_leave_nothing(bomb, mode, sandbox_parent):
    probe = layers(mode)
    require(probe.privileges_dropped or not ROOT, "root is exempt from RLIMIT_NPROC: not running a bomb")
    before = nobody_entries()
    code = f"import os, sys\nprint(os.getcwd(), flush=True)\n{BOMBS[bomb]}"
    r = run(code, mode, sandbox_parent, max_processes=10, timeout_s=1.0)
    assert r.status in ("timeout", "killed", "passed", "failed") and r.duration_s < 2.5
    home = r.stdout.splitlines()[0]
    if ROOT:  # only root may read the environ of nobody's processes
        deadline = time.monotonic() + 2.0
        while (left := processes_of_run(home)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == set(), "every process of the bomb died with the run"
    wait_for_reaping(before)


def test_memory_bomb_across_processes(mode, sandbox_parent):
    """Each process is held to RLIMIT_AS; the run as a whole may use up to max_processes times that (documented)."""
    code = """
import os
for _ in range(3):
    if os.fork() == 0:
        break
blocks = []
while True:
    blocks.append(bytearray(16 << 20))
"""
    before = nobody_entries()
    r = run(code, mode, sandbox_parent, memory_bytes=128 << 20)
    wait_for_reaping(before)
    assert r.status in ("failed", "killed") and r.duration_s < SMALL.timeout_s
    assert r.status == "killed" or "MemoryError" in r.stderr


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_endless_output_is_capped_and_ended(stream, mode, sandbox_parent):
    """Ended by the CPU limit, or by the deadline when draining the pipe is what holds the program back."""
    code = f"import sys\nwhile True:\n    sys.{stream}.write('x' * 65536)"
    r = run(code, mode, sandbox_parent, max_output_bytes=1000, timeout_s=1.5)
    assert r.status in ("killed", "timeout") and r.duration_s < 2.5
    assert getattr(r, stream) == "x" * 1000 and getattr(r, f"{stream}_truncated")


def test_endless_loop_in_a_child_is_ended(mode, sandbox_parent):
    """RLIMIT_CPU is per process: the spinning child gets SIGXCPU; a parent that sleeps meets the deadline."""
    spin = "import os\nif os.fork() == 0:\n    while True:\n        pass\n"
    code = spin + "print(os.waitstatus_to_exitcode(os.wait()[1]))"
    r = run(code, mode, sandbox_parent, timeout_s=6.0)  # 1 s of CPU can take a few on a busy machine
    assert r.status == "passed" and r.stdout == f"{-signal.SIGXCPU}\n"
    code = spin + "import time\ntime.sleep(60)"
    r = run(code, mode, sandbox_parent, timeout_s=1.5)
    assert r.status == "timeout" and r.duration_s < 2.5


def test_ctypes_memory_writes_only_hurt_the_program(mode, sandbox_parent):
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(b"pwned")

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

local = IoVec(ctypes.addressof(buf), 5)
for pid in ({os.getpid()}, os.getppid()):  # process_vm_writev needs ptrace rights over the target
    remote = IoVec(0x400000, 5)
    n = libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    print("process_vm_writev", pid, n, ctypes.get_errno(), flush=True)
ctypes.memset(0, 1, 8)  # the program's own memory: a segfault, reported as a crash
"""
    r = run(code, mode, sandbox_parent)
    probe = layers(mode)
    assert r.status == "crashed" and r.returncode == -signal.SIGSEGV and "SIGSEGV" in r.reason
    lines = [line.split() for line in r.stdout.splitlines()]
    assert lines[1][2] == "-1", "init is not dumpable: nobody and the host's user alike are refused"
    if other_user(probe) or probe.pid_isolated:
        assert lines[0][2] == "-1", "the test process is out of reach"
