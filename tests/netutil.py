"""Helpers for tests that send real packets inside namespaces the test made."""
from __future__ import annotations

import socket
import subprocess
import time

from labctl.kernel import nsutil


def ping(namespace: str, address: str, count: int = 1, timeout: float = 2.0) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", namespace, "ping", "-n", "-q", "-c", str(count),
                             "-W", str(timeout), address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def udp_socket_in(namespace: str) -> socket.socket:
    with nsutil.entered(namespace):
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def send_udp(namespace: str, dst: str, sport: int, dport: int, payload: bytes, count: int) -> None:
    s = udp_socket_in(namespace)
    try:
        s.bind(("0.0.0.0", sport))
        for _ in range(count):
            s.sendto(payload, (dst, dport))
    finally:
        s.close()


def wait_for(predicate, timeout: float = 5.0, step: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()
