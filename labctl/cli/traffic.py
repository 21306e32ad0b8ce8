"""Playing workloads on a running lab: run."""
from __future__ import annotations

import json
import sys

import click

from labctl.cli.base import cli

@cli.command()
@click.argument("workload", type=click.Path(exists=True))
@click.option("--lab", "lab_name", help="the lab to run on (needed when several are up)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="run directory (default runs/<time>-<name>)")
@click.option("--json", "as_json", is_flag=True, help="print results.json instead of the table")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="experiments only: a lab variable set after the experiment's own set: "
                   "(e.g. dilation=16000 on a slow machine: every rate 4x lower)")
def run(workload, lab_name, out_dir, as_json, sets):
    """Play a workload on a running lab, or run an experiment (or a directory of them) end to end.

    A workload (collectives, an FSDP step, a train: step, TCP flows) plays on a lab that is up and
    reports like nccl-tests. A train: workload replays one Megatron-style training step with tensor,
    pipeline, data and expert parallel degrees (docs/parallelism.md). An experiment file (it has
    steps:) builds its own lab, captures, plays its steps, tears down, plots, writes report.md and
    exits non-zero if an expectation failed.

    Starts one agent per GPU inside its namespace; they send RoCEv2 (UDP 4791) to each other with
    real data dependencies, and every byte is accounted at the receivers. Results, the plan and the
    workload go to the run directory.

    \b
    Example:
      sudo labctl run workloads/allreduce.yml --lab ls
      sudo labctl run workloads/fsdp-llama7b.yml --out runs/fsdp
      sudo labctl run workloads/train-llama7b.yml       # train: tp=2, pp=2, dp the rest
      sudo labctl run experiments/incast-pfc.yml
      sudo labctl run experiments/                      # every bundled experiment
      sudo labctl run experiments/incast-pfc.yml --set dilation=16000
    """
    from pathlib import Path
    from labctl.experiment.run import is_experiment
    if is_experiment(Path(workload)):
        if lab_name:
            raise click.UsageError(f"--lab names a lab that is up for a workload to play on; an experiment builds "
                                   f"its own from its topology: (and takes it down): leave --lab out, or play a "
                                   f"workload on {lab_name} with `labctl run WORKLOAD.yml --lab {lab_name}`")
        _run_experiments(Path(workload), out_dir, as_json, list(sets))
        return
    if sets:
        raise click.UsageError("--set changes the lab an experiment builds; a workload plays on a lab that "
                               "is up (`labctl up LAB.yml --set KEY=VALUE` first)")
    from labctl import lifecycle as labmod
    from labctl.traffic import report
    from labctl.traffic.run import default_run_dir, new_run_dir, run_workload
    from labctl.traffic.workload import load_workload
    loaded = load_workload(workload)
    labmod.require_root("labctl run")
    lab = labmod.default_lab(lab_name)
    plan = labmod.load_plan(lab)
    target = new_run_dir(Path(out_dir) if out_dir else default_run_dir(loaded.workload.name))

    def progress(done, total, label):
        if sys.stderr.isatty():
            print(f"\r  {done}/{total} {label:<60}", end="", file=sys.stderr, flush=True)

    doc = run_workload(plan, lab, loaded, target, progress, trace=labmod.trace_path)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(report.table(doc))
    click.echo(f"# results: {target / 'results.json'}")
    if any(r["wrong"] or r["timed_out"] for r in doc["results"]):
        raise SystemExit(1)



def _run_experiments(target, out_dir, as_json, sets: list[str]) -> None:
    import time
    from pathlib import Path
    from labctl import lifecycle as labmod
    from labctl.experiment.report import answer
    from labctl.experiment.run import experiment_files, prepare, run_experiment
    files = experiment_files(target)
    base = Path(out_dir) if out_dir else Path("runs")
    outs = {f: (base if out_dir and len(files) == 1 else base / f"{time.strftime('%Y%m%d-%H%M%S')}-{f.stem}")
            for f in files}
    from labctl.traffic.run import new_run_dir
    for f in files:                      # every file checked before the first lab is built
        new_run_dir(outs[f])
        prepare(f, outs[f], sets)
    labmod.require_root("labctl run (an experiment builds a lab)")
    failed = []
    for f in files:
        doc = run_experiment(f, outs[f], sets=sets)
        if as_json:
            click.echo(json.dumps(doc, indent=1))
        else:
            click.echo(f"# experiment {doc['experiment']}: report {outs[f] / 'report.md'}")
            click.echo(answer(doc) + "\n")
        if not doc["passed"]:
            failed.append(doc["experiment"])
    if len(files) > 1:
        click.echo(f"# {len(files) - len(failed)} of {len(files)} experiments passed"
                   + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed:
        raise SystemExit(1)
