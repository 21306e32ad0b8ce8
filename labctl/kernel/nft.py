"""libnftables through ctypes: nftables commands in a namespace without spawning `nft` each time.

A context whose first command runs inside a namespace keeps its netlink socket there, so one
context per namespace can be driven from anywhere afterwards (~50 µs a command).
"""
from __future__ import annotations

import ctypes
import ctypes.util

from labctl.kernel import nsutil
from labctl.errors import LabError
from labctl.plan.qos import class_minor, dscp_map

_lib = None


def _load():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            raise LabError("libnftables is missing", "apt-get install nftables (install.sh does)") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        for f in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        for f in ("nft_ctx_get_error_buffer", "nft_ctx_get_output_buffer"):
            getattr(lib, f).restype = ctypes.c_char_p
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        _lib = lib
    return _lib


class Nft:
    def __init__(self, namespace: str):
        lib = _load()
        self.namespace = namespace
        with nsutil.entered(namespace):
            self.ctx = lib.nft_ctx_new(0)
            lib.nft_ctx_buffer_output(self.ctx)
            lib.nft_ctx_buffer_error(self.ctx)
            self.run("list tables")  # binds the context's netlink socket to this namespace

    def run(self, commands: str) -> str:
        lib = _load()
        rc = lib.nft_run_cmd_from_buffer(self.ctx, commands.encode())
        out = lib.nft_ctx_get_output_buffer(self.ctx) or b""
        err = lib.nft_ctx_get_error_buffer(self.ctx) or b""
        if rc != 0:
            raise LabError(f"nftables in {self.namespace} refused: {err.decode().strip()}")
        return out.decode()

    def close(self) -> None:
        if self.ctx:
            _load().nft_ctx_free(self.ctx)
            self.ctx = None


def classify_ruleset(classes: list[dict], bridged: bool = False) -> str:
    """nftables for a switching node: DSCP → skb->priority (the HTB class) on what it forwards; in
    the bridge family on an L2 switch, where frames never pass the IP forward hook."""
    rules = "\n".join(f"    ip dscp {d} meta priority set 1:{class_minor(tc):x}"
                      for d, tc in sorted(dscp_map(classes).items()))
    family = "bridge" if bridged else "ip"
    return (f"table {family} labctl {{\n  chain classify {{\n    type filter hook forward priority 0; policy accept;\n"
            f"{rules}\n  }}\n}}\n")
