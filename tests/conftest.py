"""Shared fixtures. Tests that build labs use their own state directory and the name prefix `lt`,
so they never touch another lab, and always tear down what they built, even when they fail."""
from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_PREFIX = "lt"


def pytest_collection_modifyitems(config, items):
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
