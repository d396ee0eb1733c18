"""The fast tier's guard (`tests.tiers`): a planted fast test fails for each route by which a
test can start a process or listen on a socket, also when the code under test swallows the
error or a thread it started does it; the same test marked ``process`` runs."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from gpufleet.testing.timescale import scaled
from tests.tiers import GUARD

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.tiers import pytest_runtest_makereport, pytest_runtest_protocol, pytest_runtest_teardown
"""
INI = """
[pytest]
markers =
    process: starts a process
    browser: drives a browser
"""

# route -> the body of a planted test that takes it
PLANTS = {
    "subprocess.run": "import subprocess\nsubprocess.run(['true'], check=False)",
    "os.fork": "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)",
    "os.posix_spawn": "import os\npid = os.posix_spawn('/bin/true', ['true'], {})\n"
    "os.waitpid(pid, 0)",
    "os.system": "import os\nos.system('true')",
    "multiprocessing": "import multiprocessing as mp\n"
    "p = mp.get_context('spawn').Process(target=print)\np.start()\np.join()",
    "asyncio subprocess": "import asyncio\n"
    "async def go():\n    p = await asyncio.create_subprocess_exec('true')\n    await p.wait()\n"
    "asyncio.run(go())",
    "socket.listen": "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n"
    "s.listen()\ns.close()",
    "uvloop server (uvicorn's loop)": "import asyncio, uvloop\n"
    "async def go():\n"
    "    loop = asyncio.get_running_loop()\n"
    "    srv = await loop.create_server(asyncio.Protocol, '127.0.0.1', 0)\n"
    "    srv.close()\n"
    "uvloop.run(go())",
    # libc's posix_spawn: the child execs /bin/true at once and runs no Python. A child of a
    # raw fork() returns into Python, which in a process with other threads can wait forever
    # on a lock another thread held at the fork: through ctypes.CDLL (the GIL), then through
    # PyDLL too (a fresh-clone run hung there); the parent's waitpid then hung 900 s
    "a child started below Python": "import ctypes, pathlib\n"
    "libc = ctypes.CDLL(None)\n"
    "pid = ctypes.c_int()\n"
    "argv = (ctypes.c_char_p * 2)(b'/bin/true', None)\n"
    "envp = (ctypes.c_char_p * 1)(None)\n"
    "assert libc.posix_spawn(ctypes.byref(pid), b'/bin/true', None, None, argv, envp) == 0\n"
    "pathlib.Path('child.pid').write_text(str(pid.value))\n",  # left unreaped: the guard sees it
    "swallowed by the code under test": "import subprocess\n"
    "try:\n    subprocess.run(['true'])\nexcept Exception:\n    pass",
    "from a thread the test started": "import subprocess, threading\n"
    "t = threading.Thread(target=lambda: subprocess.run(['true']))\nt.start()\nt.join()",
}


@pytest.fixture(autouse=True)
def enforcing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted tests fail even in a run that only records (``GPUFLEET_TIER_AUDIT``)."""
    monkeypatch.setattr(GUARD, "audit_path", None)


def _plant(pytester: pytest.Pytester, body: str, mark: str = "") -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    test = "import pytest\n\n" + mark + "def test_planted():\n" + textwrap.indent(body, "    ")
    pytester.makepyfile(test_planted=test)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")


def _reap(pid: int) -> None:
    """Wait for the planted child to exit (it exits at once); one still there after the
    deadline is killed and the test fails saying so, rather than waiting forever."""
    deadline = time.monotonic() + scaled(10.0)
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the planted child {pid} did not exit by itself (killed)")


@pytest.mark.parametrize("route", list(PLANTS))
def test_a_fast_test_that_starts_a_process_fails(pytester: pytest.Pytester, route: str) -> None:
    result = _plant(pytester, PLANTS[route])
    child = pytester.path / "child.pid"
    if child.exists():  # reap the planted test's child, so this test leaves none either
        _reap(int(child.read_text()))
    result.assert_outcomes(failed=1)
    assert "fast-tier test" in result.stdout.str()


def test_the_failure_names_the_route_and_the_mark(pytester: pytest.Pytester) -> None:
    result = _plant(pytester, PLANTS["swallowed by the code under test"])
    out = result.stdout.str()
    assert "subprocess" in out and "@pytest.mark.process" in out


@pytest.mark.process  # the planted test does start `true`: so does this one
def test_a_marked_test_may_start_processes(pytester: pytest.Pytester) -> None:
    result = _plant(pytester, PLANTS["subprocess.run"], mark="@pytest.mark.process\n")
    result.assert_outcomes(passed=1)


def test_a_fast_test_that_only_computes_passes(pytester: pytest.Pytester) -> None:
    result = _plant(pytester, "assert sum(range(4)) == 6")
    result.assert_outcomes(passed=1)


@pytest.mark.process  # its planted session fixture runs `true` when it ends
def test_a_wider_fixture_ending_in_a_fast_tests_teardown_is_not_the_tests(
    pytester: pytest.Pytester,
) -> None:
    """A session fixture used by a ``process`` test ends in the teardown of the last test,
    here a fast one (in CI: the PostgreSQL server's ``pg_ctl stop``)."""
    pytester.makeconftest(
        CONFTEST
        + "import subprocess, pytest\n"
        + "@pytest.fixture(scope='session')\n"
        + "def daemon():\n    yield\n    subprocess.run(['true'], check=True)\n"
    )
    pytester.makeini(INI)
    pytester.makepyfile(
        test_order="import pytest\n\n"
        "@pytest.mark.process\ndef test_a_uses_it(daemon):\n    pass\n\n"
        "def test_b_fast():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)
