"""report.md of an experiment: the answer first, then the numbers, the plots and what was run."""
from __future__ import annotations

from pathlib import Path

from labctl.experiment.spec import METRICS, Experiment

SHOWN = ("time_s", "busbw", "ratio", "wrong", "gaps", "drops", "lossless_drops", "ecn_marked", "pfc_tx",
         "max_depth", "uplink_imbalance", "link_imbalance", "reordered_share", "naks", "retransmitted_bytes", "ring_collisions", "predicted_imbalance",
         "wan_bytes", "tcp_goodput_bps", "victim_time_s", "retransmits",
         "wan_max_depth", "wan_drops", "zone_pfc_tx", "wan_port_bytes", "wan_short_bytes", "wan_long_bytes",
         "wan_long_share", "wan_bound_s",
         "wan_expected_bytes", "duty_cycle", "wan_hidden_fraction", "model_step_s", "model_swapped_step_s",
         "model_flip_km", "ep_hot_ratio", "ep_hot_expected", "ep_busy_s")


def answer(doc: dict) -> str:
    held = [c for c in doc["expectations"] if c["passed"]]
    failed = [c for c in doc["expectations"] if not c["passed"]]
    head = (f"**{len(held)} of {len(doc['expectations'])} expectations held.**" if doc["expectations"]
            else "**No expectations were given.**")
    lines = [head, ""]
    for c in failed + held:
        lines.append(f"- {'PASS' if c['passed'] else 'FAIL'}: {c['what']}: {c['measured']}")
    return "\n".join(lines)


def write_report(out: Path, exp: Experiment, doc: dict) -> Path:
    lines = [f"# Experiment {exp.name}", "", "## Answer", "", answer(doc), ""]
    if doc.get("summary_plot"):
        lines += [f"![summary]({doc['summary_plot']})", ""]
    if doc["description"]:
        lines += ["## The question", "", doc["description"], ""]
    lines += ["## Runs", ""]
    used = [m for m in SHOWN if any(v.get(m) for v in doc["metrics"].values())]
    lines.append("| run | " + " | ".join(used) + " |")
    lines.append("|---|" + "---:|" * len(used))
    for name, m in doc["metrics"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(m[k]) for k in used) + " |")
    lines += ["", "Metrics: " + "; ".join(f"`{k}` {METRICS[k]}" for k in used), ""]
    if doc.get("notes"):
        lines += ["## What the runs say", ""]
        for name, notes in doc["notes"].items():
            lines += [f"- **{name}**: " + "; ".join(notes)]
        lines.append("")
    lines += ["## Plots", ""]
    for name, files in doc["plots"].items():
        lines.append(f"### {name}")
        lines += [f"![{Path(f).stem}]({f})" for f in files]
        lines.append("")
    if doc["captures"]:
        lines += ["## Captures", "", "Open with `wireshark FILE`, or `tshark -r FILE --disable-protocol rpcordma` "
                  "(RoCE decodes as RRoCE, PFC as MAC Control). For an encrypted WAN, add the lab's esp_sa "
                  "(see README).", ""]
        lines += [f"- [{f}]({f})" for f in doc["captures"]]
        lines.append("")
    lines += ["## What was run", "", "```yaml", (out / "experiment.yml").read_text().rstrip(), "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _cell(v: float) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}"
    return f"{int(v)}"
