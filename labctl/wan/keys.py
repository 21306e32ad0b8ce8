"""ESP keys for a lab's encrypted links: fresh at every `up`, kept in the lab directory only.

esp-keys.json is what the line reads; esp_sa is the same SAs in Wireshark's format: copy it to
~/.config/wireshark/esp_sa, or pass it to tshark (see `tshark_options`). Both hold the keys, so
both are 0600 and never written through a symlink.
"""
from __future__ import annotations

import json
from pathlib import Path

from labctl.plan.model import LabPlan
from labctl.state import write_private
from labctl.wan import esp


def write_keys(plan: LabPlan, lab_path: Path) -> dict:
    keys: dict[str, dict] = {}
    lines = []
    for lk in plan.links:
        if lk.wire is None or not lk.encrypt:
            continue
        (a_node, a_if), (b_node, b_if) = lk.ends
        a = plan.node(a_node).iface(a_if).address.split("/")[0]
        b = plan.node(b_node).iface(b_if).address.split("/")[0]
        ab = esp.Sa.new(0x1000 + 2 * lk.id, a, b)
        ba = esp.Sa.new(0x1001 + 2 * lk.id, b, a)
        keys[str(lk.id)] = {"ab": ab.to_dict(), "ba": ba.to_dict()}
        lines += [ab.wireshark_sa(), ba.wireshark_sa()]
    if not keys:
        return keys
    write_private(Path(lab_path) / "esp-keys.json", json.dumps(keys))
    write_private(Path(lab_path) / "esp_sa", "# Wireshark ESP SAs of this lab (uat:esp_sa)\n" + "\n".join(lines) + "\n")
    return keys


def tshark_options(lab_path: Path) -> list[str]:
    """tshark arguments that decrypt this lab's ESP: the SAs as uat:esp_sa records."""
    path = Path(lab_path) / "esp_sa"
    records = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    opts = ["-o", "esp.enable_encryption_decode:TRUE"]
    for r in records:
        opts += ["-o", f"uat:esp_sa:{r}"]
    return opts
