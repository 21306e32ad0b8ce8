"""Entering namespaces from several threads at once leaves every thread where it started."""
from __future__ import annotations

import os
import threading
import uuid

import pytest

from conftest import require_root
from labctl.kernel import nsutil

pytestmark = pytest.mark.netns


def test_threads_entering_namespaces_at_once_each_come_back_to_their_own():
    require_root()
    names = [f"ltns{uuid.uuid4().hex[:6]}-a", f"ltns{uuid.uuid4().hex[:6]}-b"]
    home = os.readlink("/proc/thread-self/ns/net")
    try:
        for n in names:
            nsutil.create(n)
        assert os.readlink("/proc/thread-self/ns/net") == home
        wrong: list[str] = []

        def hammer(name: str) -> None:
            mine = os.readlink("/proc/thread-self/ns/net")
            for _ in range(2000):
                with nsutil.entered(name):
                    pass
            if os.readlink("/proc/thread-self/ns/net") != mine:
                wrong.append(threading.current_thread().name)

        threads = [threading.Thread(target=hammer, args=(names[k % 2],), name=f"t{k}") for k in range(3)]
        for t in threads:
            t.start()
        for _ in range(2000):
            with nsutil.entered(names[0]):
                pass
        for t in threads:
            t.join()
        assert os.readlink("/proc/thread-self/ns/net") == home, "the main thread was left in a lab namespace"
        assert not wrong, wrong
    finally:
        for n in names:
            if nsutil.exists(n):
                nsutil.remove(n)
