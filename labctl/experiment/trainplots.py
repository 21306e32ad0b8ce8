"""The plot of a train: run: each fabric's load over the step and the GPUs computing, so the
on/off bursts and the duty cycle show (from results.json's train.load)."""
from __future__ import annotations

import json
from pathlib import Path

from labctl.experiment.plots import Series, _save, plt


def bursts(run_dir: Path, path: Path) -> Series:
    doc = json.loads((run_dir / "results.json").read_text())
    t = doc["train"]
    load = t["load"]
    xs = [(k + 0.5) * load["bin_s"] for k in range(len(load["computing"]))]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4))
    for fabric, rates in load["Bps"].items():
        if any(rates):
            series[fabric] = (xs, [r * 8 / 1e6 for r in rates])
            ax.plot(xs, series[fabric][1], label=f"{fabric} (Mbit/s, lab)")
    right = ax.twinx()
    series["computing"] = (xs, load["computing"])
    right.fill_between(xs, load["computing"], step="mid", alpha=0.2, color="grey", label="GPUs computing")
    right.set_ylabel("GPUs computing")
    title = (f"{doc['workload']}: placement {t['placement']}, duty cycle {t['duty_cycle']:.0%}, "
             f"step {t['step_time_s']:.2f} s")
    _save(fig, ax, title, "lab time in the step (s)", "load per fabric (Mbit/s, lab)", path)
    return series
