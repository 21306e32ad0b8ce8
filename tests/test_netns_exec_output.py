"""An exec line's output is streamed and only its tail kept, and a line that will not stop is
given up on at the timeout: `exec: [yes]` once filled root's memory (the whole output was read
into it, in a container node through the engine, in a namespace node through a pipe)."""
from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest

from conftest import require_root
from labctl.kernel import nsutil
from labctl.lifecycle import software

pytestmark = pytest.mark.netns


def test_a_namespace_nodes_endless_line_is_cut_at_the_timeout_with_its_tail_kept(lab_name, monkeypatch):
    require_root()
    monkeypatch.setattr(software, "EXEC_TIMEOUT_S", 1.5)
    node = SimpleNamespace(name="r1", namespace=f"{lab_name}-r1")
    nsutil.create(node.namespace)
    try:
        t0 = time.monotonic()
        code, out = software._in_namespace(node, ["yes", "labctl"])        # gigabytes a second
        assert code == 124 and "still running after 1.5 s" in out
        assert time.monotonic() - t0 < 3
        code, out = software._in_namespace(node, ["sh", "-c", "seq 1 100000; echo failed here >&2; exit 3"])
        assert code == 3 and out.endswith("100000\nfailed here\n") and len(out) <= software.OUTPUT_KEPT
        assert software._in_namespace(node, ["true"]) == (0, "")
    finally:
        nsutil.remove(node.namespace)


class Engine:
    """An engine whose exec streams what `chunks` yields, then reports `code`."""

    def __init__(self, chunks, code=0):
        self.api = SimpleNamespace(exec_create=lambda cid, argv, **kw: {"Id": "e1"},
                                   exec_start=lambda eid, stream=False: chunks if stream else b"".join(chunks),
                                   exec_inspect=lambda eid: {"ExitCode": code})


def test_a_container_nodes_endless_output_is_cut_at_the_timeout_with_its_tail_kept(monkeypatch):
    monkeypatch.setattr(software, "EXEC_TIMEOUT_S", 0.5)
    ctr = SimpleNamespace(id="ab" * 32)
    endless = (b"y\n" * 32768 for _ in itertools.count())              # what `yes` streams, for ever
    t0 = time.monotonic()
    assert software._in_container(Engine(endless), ctr, ["yes"]) == (124, "still running after 0.5 s")
    assert time.monotonic() - t0 < 2
    # a silent line (the stream's reads have no timeout): given up on at the deadline all the same
    def silent():
        time.sleep(30)
        yield b"too late"
    t0 = time.monotonic()
    assert software._in_container(Engine(silent()), ctr, ["sleep", "100000"]) == (124, "still running after 0.5 s")
    assert time.monotonic() - t0 < 2
    code, out = software._in_container(Engine(iter([b"x" * 10000, b"last words\n"]), 2), ctr, ["false"])
    assert code == 2 and out.endswith("last words\n") and len(out) == software.OUTPUT_KEPT


def test_a_container_that_exits_at_once_has_only_its_outputs_tail_read():
    """Its last 5 log lines were read whole, whatever their length: a node's image printing one
    line of gigabytes filled root's memory before `up` could say it exited."""
    from labctl.containers.nodes import last_output
    held = []

    def one_long_line():
        for _ in range(256):               # 256 MiB if it were kept
            chunk = b"x" * (1 << 20)
            held.append(len(chunk))
            yield chunk
        yield b"\nexec failed: no such file\n"

    out = last_output(one_long_line())
    assert out.endswith("exec failed: no such file\n") and len(out) == 4096 and len(held) == 256
