"""Shared fixtures. Tests that build labs use their own state directory and the name prefix `lt`,
so they never touch another lab, and always tear down what they built, even when they fail."""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_PREFIX = "lt"
# The bundled leaf-spine's ECMP draw under which the ring's two fabric hops (srv1-gpu3 -> srv2-gpu0,
# srv2-gpu3 -> srv1-gpu0, both leaf4 -> leaf1) take different spines under both hashes, the kernel's
# (6.11+) and labctl's (before 6.11): seeds 1, 3 and 9 put them on one under both, and a ring then
# runs at half rate behind that uplink (and a lossy one drops there).
RING_SEED = "hash_seed=7"


# Under pytest-xdist (test.sh runs two workers) a module's tests stay on one worker, so its
# module-scoped lab is built once. Modules that share something machine-wide run on one worker
# together: the Docker engine that the first of them starts and the last stops, Mininet's node
# shells (found by their command line), and root's own prompt history file.
SHARED_WORKER = {
    "docker": ("test_netns_bgp", "test_netns_clab_files", "test_netns_containers", "test_netns_trust"),
    "mininet": ("test_netns_mininet", "test_netns_collisions", "test_api"),
    "history": ("test_netns_prompt", "test_hardening"),
}
# Modules that measure time, rate or loss against a bound: their labs forward on the CPU, and
# their PFC and ECN react from a user-space controller. Beside a second worker's lab the controller
# reacted in up to 105 ms against a 30 ms headroom (the lossless class lost frames), the queue
# sampler fell to 62 Hz, and steps ran past their bound. They carry the solo mark: test.sh runs
# them after the parallel part, one at a time, as every figure in the README was measured. A test
# in such a module that bounds nothing in time, rate or loss (a lab that comes up and answers
# pings, an exported script) carries the `untimed` mark and runs in the parallel part.
# test_netns_bgp (BFD at 100 ms x 3, a reconvergence budget) and test_netns_fastpath (marks and
# pauses counted on two labs) failed in the parallel part beside the other worker's labs, in 3 of
# 6 runs (sessions down, ECN marks 7.7% apart), whichever way ECN was marked; alone they pass.
SOLO = ("test_netns_lossless", "test_netns_pfc", "test_netns_dcqcn", "test_netns_ecn", "test_netns_ecn_scaled",
        "test_netns_runtime", "test_netns_experiments", "test_netns_traffic", "test_netns_classes",
        "test_netns_shaping", "test_netns_wan", "test_netns_estimate", "test_netns_esp_wire",
        "test_netns_lb", "test_netns_te", "test_netns_train", "test_netns_mininet", "test_netns_bundled",
        "test_netns_flow_order", "test_netns_fabric", "test_netns_bgp", "test_netns_fastpath", "test_netns_agents",
        "test_netns_cluster")   # three engines of its own, and the default one the "docker" group stops
# the longest groups start first, so neither worker is left with a long one at the end
LONGEST_FIRST = ("mininet", "docker", "test_netns_lossless")


def worker_group(nodeid: str) -> str:
    module = Path(nodeid.split("::")[0]).stem
    for group, modules in SHARED_WORKER.items():
        if module in modules:
            return group
    return module


if importlib.util.find_spec("xdist"):
    def pytest_xdist_make_scheduler(config, log):
        """xdist's own loadgroup marks do not group under pytest 9 (they rewrite a node id that
        pytest 9 no longer reads): group by module here instead, longest groups first."""
        from xdist.scheduler import LoadScopeScheduling

        class ByWorkerGroup(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return worker_group(nodeid)

        config.option.loadscopereorder = False
        return ByWorkerGroup(config, log)


# hypothesis keeps what it found, and a cache of each module's constants, in .hypothesis/ under the
# working directory, the source tree. Tests never write there: its home is a private temporary
# directory, removed when the process ends, and a failing example is printed with what reproduces it.
if importlib.util.find_spec("hypothesis"):
    from hypothesis import settings as _hypothesis_settings
    from hypothesis.configuration import set_hypothesis_home_dir
    _HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="labctl-tests-hypothesis-")
    atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)
    set_hypothesis_home_dir(_HYPOTHESIS_HOME)
    _hypothesis_settings.register_profile("labctl", database=None)
    _hypothesis_settings.load_profile("labctl")

# what the installer, git, Python and pytest keep in a checkout: every other file is the source
NOT_SOURCE = {".venv", ".git", "__pycache__", ".pytest_cache", "labctl.egg-info"}
SOURCE_BEFORE = pytest.StashKey[dict]()


def source_tree() -> dict[str, int]:
    """Every file of the checkout (outside NOT_SOURCE) and its modification time."""
    files = {}
    for root, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE]
        for name in names:
            path = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):
                files[os.path.relpath(path, ROOT)] = os.lstat(path).st_mtime_ns
    return files


_RUN_PID = os.getpid()


def _interrupted(signum, frame):
    if os.getpid() != _RUN_PID:
        # a fork of the run (a process pool's worker, a child labctl forks) inherits this handler:
        # it dies of the signal, as before. Raised there, KeyboardInterrupt unwound the copy of
        # pytest's stack the fork holds: it printed a summary and ran the fixtures' teardowns,
        # taking down the labs the real run was still using (ci90)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # SIGTERM (CI's stop, a timeout's kill) ends the run as Ctrl-C does: the fixtures' teardowns run,
    # so labs, namespaces and controllers a test built are taken down. Killed outright, pytest left
    # a lab's namespaces and its controller running (found running 13 minutes later)
    global _RUN_PID
    _RUN_PID = os.getpid()
    signal.signal(signal.SIGTERM, _interrupted)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):      # once, in the process xdist's workers report to
        session.config.stash[SOURCE_BEFORE] = source_tree()


def pytest_sessionfinish(session, exitstatus):
    """Tests write under pytest's temporary directories, never into the checkout: a run that added,
    changed or removed a file there fails, and names it."""
    before = session.config.stash.get(SOURCE_BEFORE, None)
    if before is None:
        return
    after = source_tree()
    touched = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    if touched:
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(
            f"the tests wrote into the source tree {ROOT} (or a file was edited during the run): "
            + ", ".join(touched[:20]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(item.nodeid.split("::")[0]).stem in SOLO and "untimed" not in item.keywords:
            item.add_marker(pytest.mark.solo)
    rank = {g: i for i, g in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.nodeid), len(rank)))
    skip_without_root(items)


def skip_without_root(items):
    """Without root the real-namespace tests skip, with the reason (contributors without root run
    `pytest -m "not netns"`); as root, as in CI, nothing is ever skipped."""
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="builds real namespaces: needs root (as CI runs); "
                                   "without root run `pytest -m \"not netns\"`")
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(skip)


def host_cpu() -> tuple[float, float, float]:
    """Seconds the host's CPUs were busy, idle and stolen by the hypervisor (/proc/stat, all CPUs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, (idle + iowait) / tick, steal / tick


_CPU_SINCE: dict[str, tuple[float, float, float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # a module-scoped fixture (the experiments' one run) does its work in the first test's setup
    _CPU_SINCE.setdefault(item.module.__name__, host_cpu())
    _CPU_SINCE[item.nodeid] = host_cpu()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A timing-bound test that fails on a shared CI host says how much CPU the host had: the
    section shows under the failure, so a slowed machine is told apart from a slow lab."""
    outcome = yield
    if outcome.excinfo is not None:
        now = host_cpu()
        lines = []
        for what, key in (("this test (its setup and call)", item.nodeid), ("its module so far", item.module.__name__)):
            busy, idle, steal = (b - a for a, b in zip(_CPU_SINCE.get(key, now), now))
            lines.append(f"during {what}: busy {busy:.1f} s, idle {idle:.1f} s, stolen by the hypervisor "
                         f"{steal:.1f} s on {os.cpu_count()} CPUs")
        item.add_report_section("call", "host cpu", "\n".join(lines) + f"\nload {os.getloadavg()}")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("LABCTL_STATE_DIR", str(d))
    return d


@contextlib.contextmanager
def module_state_dir(tmp_path_factory):
    """A module-scoped fixture's own state directory, under pytest's temporary tree (which pytest
    prunes), and the caller's LABCTL_STATE_DIR back afterwards."""
    old = os.environ.get("LABCTL_STATE_DIR")
    os.environ["LABCTL_STATE_DIR"] = str(tmp_path_factory.mktemp("state"))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LABCTL_STATE_DIR", None)
        else:
            os.environ["LABCTL_STATE_DIR"] = old


def take_down(names) -> None:
    """A module fixture's labs, down whatever state they were left in; none may leave a namespace."""
    from labctl import lifecycle as labmod
    from labctl import state
    for name in names:
        if state.lab_dir(name).path.exists():
            labmod.down(name)
        assert lab_namespaces(name + "-") == []


def lab_namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


@pytest.fixture
def lab_name():
    """A unique lab name; the fixture removes any namespace left with that prefix afterwards."""
    name = f"{TEST_PREFIX}{uuid.uuid4().hex[:6]}"
    yield name
    leftovers = lab_namespaces(name + "-")
    for ns in leftovers:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert not leftovers, f"test left namespaces behind: {leftovers}"


@pytest.fixture
def built_lab(state_dir, lab_name):
    """Build labs with a test name; destroy them whatever happens."""
    from labctl import lifecycle as labmod
    from labctl import state
    made = []

    def build(file, sets=(), name=None):
        name = name or lab_name
        plan, d, _ = labmod.up(str(file), sets, name)
        made.append(name)
        return plan

    yield build
    from labctl import backends
    for name in made:
        d = state.lab_dir(name)
        if d.path.exists():
            backends.get("netns").destroy(d)


def require_root():
    assert os.geteuid() == 0, "this test builds real namespaces and must run as root (CI does)"


@pytest.fixture(scope="session")
def docker_engine():
    """A running Docker engine with labctl's host and FRR images (built once per machine, then
    cached): started here if none runs, and stopped again at the end if it was started here."""
    from labctl.containers import engine, images
    require_root()
    started = not engine.answering()
    engine.ensure(auto=False).close()
    client = engine.client()
    try:
        for name in ("host", "frr"):
            images.build(name, say=lambda m: None)
        yield client
    finally:
        client.close()
        if started:
            engine.stop()
            assert not engine.answering()
