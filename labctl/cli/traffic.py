"""Playing workloads on a running lab: run."""
from __future__ import annotations

import json
import sys

import click

from labctl.cli.base import cli

@cli.command()
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--lab", "lab_name", help="the lab to run on (needed when several are up)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="run directory (default runs/<time>-<name>)")
@click.option("--json", "as_json", is_flag=True, help="print results.json instead of the table")
def run(workload, lab_name, out_dir, as_json):
    """Play a workload (collectives or an FSDP step) on a running lab and report like nccl-tests.

    Starts one agent per GPU inside its namespace; they send RoCEv2 (UDP 4791) to each other with
    real data dependencies, and every byte is accounted at the receivers. Results, the plan and the
    workload go to the run directory.

    \b
    Example:
      sudo labctl run workloads/allreduce.yml --lab ls
      sudo labctl run workloads/fsdp-llama7b.yml --out runs/fsdp
    """
    from pathlib import Path
    from labctl import lab as labmod
    from labctl.traffic import report
    from labctl.traffic.run import default_run_dir, run_workload
    from labctl.traffic.workload import load_workload
    loaded = load_workload(workload)
    labmod.require_root("labctl run")
    lab = labmod.default_lab(lab_name)
    plan = labmod.load_plan(lab)
    target = Path(out_dir) if out_dir else default_run_dir(loaded.workload.name)

    def progress(done, total, label):
        if sys.stderr.isatty():
            print(f"\r  {done}/{total} {label:<60}", end="", file=sys.stderr, flush=True)

    doc = run_workload(plan, lab, loaded, target, progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(report.table(doc))
    click.echo(f"# results: {target / 'results.json'}")
    if any(r["wrong"] or r["timed_out"] for r in doc["results"]):
        raise SystemExit(1)

