"""Hostile programs against wfc.tasks.sandbox. Each run uses small limits and finishes in about a second at most.

After every test the host must be untouched: same cwd, same environment, no sandbox dir left (``sandbox_parent``).
Checks that depend on what the host permits (network namespace, dropping root) skip with the reason when absent.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from wfc.tasks.sandbox import SandboxLimits, SandboxResult, _usable_by_others, run_python, sandbox_python

SMALL = SandboxLimits(
    timeout_s=3.0, cpu_s=1, memory_bytes=256 << 20, max_processes=16, max_file_bytes=1 << 20, max_output_bytes=10_000
)
ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def host_untouched():
    def environment():  # pytest itself rewrites PYTEST_CURRENT_TEST between phases
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    cwd, env = os.getcwd(), environment()
    yield
    assert os.getcwd() == cwd
    assert environment() == env


def run(code: str, parent: str, **overrides) -> SandboxResult:
    limits = SMALL.model_copy(update=overrides) if overrides else SMALL
    return run_python(code, limits=limits, workdir_parent=parent)


def can_drop_root() -> bool:
    return ROOT and sandbox_python()[1]


def live_pids(predicate, *, zombies: bool = False) -> set[int]:
    """Pids of live (non-zombie, unless ``zombies``) processes whose /proc entry satisfies ``predicate(status_text,
    cmdline)``."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "\nState:\tZ" in status and not zombies:
            continue
        if predicate(status, cmdline):
            pids.add(int(entry.name))
    return pids


def nobody_pids() -> set[int]:
    return live_pids(lambda status, _: "\nUid:\t65534\t" in status)


def wait_for_reaping(before: set[int], timeout: float = 5.0) -> None:
    """Wait until ``nobody`` has no processes beyond ``before``, zombies included: without a PID namespace a killed
    bomb's zombies wait for the host's PID 1 to reap them, and count against RLIMIT_NPROC for the next run."""
    def entries() -> set[int]:
        return live_pids(lambda status, _: "\nUid:\t65534\t" in status, zombies=True)

    deadline = time.monotonic() + timeout
    while entries() - before and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_until_gone(predicate, *, ignore: set[int] = frozenset(), timeout: float = 2.0) -> set[int]:
    """Matching pids (minus ``ignore``) still alive after up to ``timeout`` s (a SIGKILLed tree takes a moment)."""
    deadline = time.monotonic() + timeout
    while (left := live_pids(predicate) - ignore) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# --- ordinary outcomes -----------------------------------------------------------------------------------------


def test_passing_program(sandbox_parent):
    r = run("print('hello', 6 * 7)", sandbox_parent)
    assert r.status == "passed" and r.passed and r.returncode == 0
    assert r.stdout == "hello 42\n" and r.stderr == ""
    assert not r.stdout_truncated and r.duration_s < 3


def test_failed_assert_and_exit_codes(sandbox_parent):
    r = run("assert 1 + 1 == 3, 'arithmetic'", sandbox_parent)
    assert r.status == "failed" and r.returncode == 1 and "AssertionError: arithmetic" in r.stderr
    r = run("import sys; sys.exit(3)", sandbox_parent)
    assert r.status == "failed" and r.returncode == 3
    r = run("def f(:\n    pass", sandbox_parent)
    assert r.status == "failed" and "SyntaxError" in r.stderr


def test_crash_by_signal(sandbox_parent):
    r = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", sandbox_parent)
    assert r.status == "crashed" and r.returncode == -11 and "SIGSEGV" in r.reason


def test_stdin_is_empty(sandbox_parent):
    r = run("input()", sandbox_parent)
    assert r.status == "failed" and "EOFError" in r.stderr


def test_limits_are_validated():
    with pytest.raises(ValidationError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValidationError):
        SandboxLimits(memory_bytes=1024)
    with pytest.raises(ValidationError):
        SandboxLimits(nonsense=1)
    with pytest.raises(TypeError):
        run_python(b"print(1)")


# --- hostile programs --------------------------------------------------------------------------------------------


def test_infinite_loop_hits_cpu_limit(sandbox_parent):
    r = run("while True:\n    pass", sandbox_parent)
    assert r.status == "killed" and "CPU" in r.reason
    assert r.duration_s < SMALL.timeout_s, "1 s of CPU takes longer on a busy machine, but not the deadline"


def test_sleeping_forever_hits_wall_clock(sandbox_parent):
    r = run("import time\ntime.sleep(60)", sandbox_parent, timeout_s=0.5)
    assert r.status == "timeout" and r.returncode is None
    assert 0.5 <= r.duration_s < 1.5


def test_memory_hog_is_refused(sandbox_parent):
    r = run("blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))", sandbox_parent)
    assert r.status in ("failed", "killed")
    assert r.status == "killed" or "MemoryError" in r.stderr
    assert r.duration_s < 2.5


def test_file_size_limit(sandbox_parent):
    r = run("open('big.bin', 'wb').write(b'x' * (8 << 20))", sandbox_parent)
    assert r.status in ("failed", "killed")
    assert "File too large" in r.stderr or r.status == "killed"


def test_very_large_output_is_capped(sandbox_parent):
    code = "import sys\nsys.stdout.write('o' * (5 << 20))\nsys.stderr.write('e' * (5 << 20))"
    r = run(code, sandbox_parent)
    assert r.status == "passed"
    assert r.stdout == "o" * 10_000 and r.stderr == "e" * 10_000
    assert r.stdout_truncated and r.stderr_truncated
    assert r.duration_s < 2.5


def test_environment_secrets_are_not_inherited(sandbox_parent, monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("WFC_TEST_SECRET", secret)
    # Running as root, or as the host's own user, the program could read /proc/<host pid>/environ (documented):
    # probe it only when the sandbox runs the program as `nobody`.
    probe = (os.getpid(), os.getppid(), 1) if can_drop_root() else ()
    code = f"""
import os
print(dict(os.environ))
for pid in {probe!r}:
    try:
        print(open(f"/proc/{{pid}}/environ", "rb").read())
    except OSError as e:
        print("denied", pid, e)
"""
    r = run(code, sandbox_parent)
    assert r.status == "passed"
    assert "WFC_TEST_SECRET" not in r.stdout and secret not in r.stdout + r.stderr
    environ = eval(r.stdout.splitlines()[0])  # noqa: S307 - our own program's repr of a dict of strs
    assert set(environ) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE"}


def test_cwd_is_a_fresh_private_dir(sandbox_parent, tmp_path):
    code = "import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))"
    r = run(code, sandbox_parent)
    cwd, listing = r.stdout.splitlines()
    assert cwd != os.getcwd() and cwd.startswith(sandbox_parent)
    assert listing == "['main.py']"
    assert not Path(cwd).exists(), "the working dir is removed afterwards"


def test_writing_outside_its_dir(sandbox_parent, tmp_path):
    if not can_drop_root():
        pytest.skip("running as root without an interpreter `nobody` can run: root may write anywhere")
    target = tmp_path / "escape.txt"
    code = f"""
for path in ({str(target)!r}, "../escape.txt"):
    try:
        open(path, "w").write("pwned")
        print("wrote", path)
    except OSError as e:
        print("refused", path, type(e).__name__)
"""
    r = run(code, sandbox_parent)
    assert r.status == "passed" and r.privileges_dropped
    assert "wrote" not in r.stdout and r.stdout.count("refused") == 2
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_deleting_host_files(sandbox_parent, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    relative = """
import os
try:
    os.remove("precious.txt")
    print("deleted")
except OSError as e:
    print("not found", type(e).__name__)
"""
    r = run(relative, sandbox_parent)
    assert "not found FileNotFoundError" in r.stdout, "the host's files are not reachable through the cwd"
    if can_drop_root():
        absolute = f"import os\ntry:\n    os.remove({str(precious)!r})\nexcept OSError as e:\n    print(type(e).__name__)"
        r = run(absolute, sandbox_parent)
        assert r.status == "passed" and "PermissionError" in r.stdout
    assert precious.read_text() == "keep me"


def test_socket_to_host_server_is_blocked(sandbox_parent):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = f"""
import socket
try:
    s = socket.socket()  # refused by the socket filter, or made in a namespace with no way out
    s.settimeout(1.0)
    s.connect(("127.0.0.1", {port}))
    s.sendall(b"exfiltrated")
    print("connected")
except OSError as e:
    print("blocked", e)
"""
    try:
        r = run(code, sandbox_parent)
        if not r.network_isolated:
            pytest.skip("neither a network namespace nor the socket filter here (network_isolated=False)")
        assert "blocked" in r.stdout and "connected" not in r.stdout
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_background_process_that_leaves_the_group_is_killed(sandbox_parent):
    token = f"7.{uuid.uuid4().int % 10**9:09d}"  # a sleep duration no other process on the machine uses
    code = f"""
import os
if os.fork() == 0:
    os.setsid()
    os.execv("/bin/sleep", ["sleep", "{token}"])
print("parent leaves")
"""
    r = run(code, sandbox_parent)
    assert r.status == "passed" and r.duration_s < 2.5
    if not r.pid_isolated:
        pytest.skip("no PID namespace here: a process that calls setsid() escapes the group kill")
    assert wait_until_gone(lambda _, cmdline: token in cmdline) == set()


def test_fork_bomb_is_capped_by_nproc(sandbox_parent):
    if not can_drop_root():
        pytest.skip("RLIMIT_NPROC does not bind root and no interpreter `nobody` can run: not running a fork bomb")
    before = nobody_pids()
    code = """
import os, time
n = 0
for _ in range(1000):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n)
"""
    r = run(code, sandbox_parent, max_processes=12)
    assert r.status == "passed" and r.privileges_dropped
    assert int(r.stdout) <= 12 - 3, "the sandbox's runner, init and the program count against the limit"
    assert wait_until_gone(lambda status, _: "\nUid:\t65534\t" in status, ignore=before) == set()
    wait_for_reaping(before)


def test_spinning_fork_bomb_is_cleaned_up(sandbox_parent):
    if not can_drop_root():
        pytest.skip("RLIMIT_NPROC does not bind root and no interpreter `nobody` can run: not running a fork bomb")
    before = nobody_pids()
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = run(code, sandbox_parent, max_processes=8, timeout_s=0.7)
    assert r.status in ("timeout", "killed")
    assert r.duration_s < 2.0
    assert wait_until_gone(lambda status, _: "\nUid:\t65534\t" in status, ignore=before) == set()
    wait_for_reaping(before)


def test_concurrent_runs_beyond_the_shared_process_limit_all_run(sandbox_parent):
    """RLIMIT_NPROC counts every process of ``nobody``, so 48 concurrent sandboxes of 16 processes each refuse one
    another's forks; a refused start (before the program ran) is retried, so every run passes (without the retry,
    about a third crashed with 'could not fork')."""
    if not can_drop_root():
        pytest.skip("RLIMIT_NPROC does not bind root and no interpreter `nobody` can run: nothing is shared")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(48) as pool:
        results = list(pool.map(lambda i: run(f"print({i})", sandbox_parent), range(48)))
    assert [r.status for r in results] == ["passed"] * 48, [r.reason for r in results if r.status != "passed"]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(48)]


def test_a_start_the_process_limit_keeps_refusing_ends_crashed_with_the_reason(sandbox_parent, monkeypatch):
    if not can_drop_root():
        pytest.skip("RLIMIT_NPROC does not bind root and no interpreter `nobody` can run: not holding the limit")
    import wfc.tasks.sandbox as sandbox

    monkeypatch.setattr(sandbox, "BUSY_RETRIES", 1)
    before = nobody_pids()
    # a first run holds every process its user may have (sleepers), so the second cannot start
    hold = """
import os, time
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
    except OSError:
        break
print("held", flush=True)
time.sleep(3)
"""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(run, hold, sandbox_parent, max_processes=8, timeout_s=4.0)
        time.sleep(1.5)
        refused = run("print(1)", sandbox_parent, max_processes=8)
        holder.result()
    assert refused.status == "crashed" and "fork" in refused.reason and "BlockingIOError" in refused.reason
    wait_until_gone(lambda status, _: "\nUid:\t65534\t" in status, ignore=before)
    wait_for_reaping(before)


def test_explicit_interpreter(sandbox_parent):
    r = run_python("import sys; print(sys.version_info[0])", python=sys.executable, workdir_parent=sandbox_parent)
    assert r.status == "passed" and r.stdout == "3\n"
    assert r.privileges_dropped == (ROOT and _usable_by_others(sys.executable))


def test_isolation_flags_are_reported(sandbox_parent):
    r = run("pass", sandbox_parent)
    assert isinstance(r.network_isolated, bool) and isinstance(r.pid_isolated, bool)
    assert r.privileges_dropped == can_drop_root()
    no_net = run("pass", sandbox_parent, isolate_network=False)
    assert no_net.network_isolated is False and no_net.status == "passed"
