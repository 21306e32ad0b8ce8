"""`labctl estimate`: collectives on fabrics past one machine, by a model calibrated on the lab."""
from __future__ import annotations

import json
from pathlib import Path

import click

from labctl.cli.base import cli
from labctl.errors import LabError


@cli.command()
@click.option("--gpus", type=int, default=16384, show_default=True, help="GPUs in the fabric (8k-100k is the point)")
@click.option("--gpus-per-server", type=int, default=8, show_default=True, help="GPUs per server (an NVLink domain)")
@click.option("--radix", type=int, default=64, show_default=True,
              help="ports per switch: two tiers up to radix²/2 GPUs, three up to radix³/4")
@click.option("--rate", default="400G", show_default=True, help="each GPU's scale-out NIC (and every fabric link)")
@click.option("--nvlink", default="7200G", show_default=True, help="each GPU's scale-up rate, one way (7200G: NVLink 5; 3600G: NVLink 4; 0: none)")
@click.option("--collective", type=click.Choice(["all_reduce", "reduce_scatter", "all_gather", "hier_all_reduce"]),
              default="hier_all_reduce", show_default=True, help="the collective to model")
@click.option("--size", default="1GB", show_default=True, help="the buffer, as nccl-tests' size")
@click.option("--ranks", default="all", show_default=True, help="all, rail (GPU 0 of every server) or a number")
@click.option("--qps", type=click.IntRange(1, 8), default=1, show_default=True, help="QPs per connection")
@click.option("--seeds", type=click.IntRange(1, 1024), default=32, show_default=True, help="hash draws to average")
@click.option("--seed-mode", type=click.Choice(["per-switch", "same"]), default="per-switch", show_default=True,
              help="a hash seed per switch, or one for all (as in the lab: hashes then polarise across tiers)")
@click.option("--alpha", default="14us", show_default=True,
              help="latency of a ring step between servers (NCCL's tuner: 14 us for Simple); NVLink steps take 3.4 us")
@click.option("--check", "check", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="instead: predict these lab run directories and compare with what they measured; repeatable")
@click.option("--calibrate", "calibrate", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="instead: fit the model on these run directories and write --calibration; repeatable")
@click.option("--calibration", "cal_path", type=click.Path(dir_okay=False),
              help="the calibration file (default: the bundled one, from bench/calibrate_estimate.py)")
@click.option("--train", "train_file", type=click.Path(exists=True, dir_okay=False),
              help="instead: a workload with a train: key; per-fabric bytes and the step's time on --gpus "
                   "(dp fills what tp x pp leave; sizes real, the workload's scale ignored)")
@click.option("--zones", type=int, default=1, show_default=True, help="--train: buildings the GPUs are split over")
@click.option("--distance", type=float, default=10.0, show_default=True, help="--train: km of fibre between zones")
@click.option("--wan-rate", default="51.2T", show_default=True, help="--train: the WAN's capacity each way")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def estimate(gpus, gpus_per_server, radix, rate, nvlink, collective, size, ranks, qps, seeds, seed_mode, alpha, check,
             calibrate, cal_path, train_file, zones, distance, wan_rate, as_json):
    """Estimate a collective on a fabric too large to emulate here: a model, not an emulation.

    For 8k-100k GPUs on a rail-optimised Clos of RADIX-port switches, the α-β time of each ring
    phase, with each hop's bandwidth divided by the flows ECMP puts on its busiest link, drawn
    with the lab's own hash model (the QP-derived UDP source port, hash-threshold next hops) over
    --seeds hash seeds; link loads per tier. It says how far off it was on lab runs it was not
    fitted on, from the calibration (bench/calibrate_estimate.py, 8-64 ranks on this machine).

    \b
    Examples:
      labctl estimate --gpus 16384 --collective hier_all_reduce --size 1GB
      labctl estimate --gpus 100000 --radix 128 --ranks rail --collective all_reduce --size 256MB
      labctl estimate --train workloads/train-llama7b.yml --gpus 16384 --zones 2 --distance 50
      labctl estimate --gpus 8192 --seed-mode same       # one seed on every switch: polarisation
      labctl estimate --check runs/20261202-101500-allreduce    # the model against a lab run
      labctl estimate --calibrate runs/a --calibrate runs/b --calibration my-cal.json
    """
    if train_file:
        from labctl.estimate.train import estimate_file, text
        from labctl.units import parse_duration_ns, parse_rate
        nv = parse_rate(nvlink) if str(nvlink) not in ("0", "none") else 0
        result = estimate_file(Path(train_file), gpus, gpus_per_server, float(parse_rate(rate)), float(nv), zones,
                               distance, float(parse_rate(wan_rate)), parse_duration_ns(alpha) / 1e9)
        click.echo(json.dumps(result, indent=1) if as_json else text(result))
        return
    from labctl.estimate import calibration, report
    from labctl.estimate.fabric import Clos
    from labctl.estimate.model import Params
    from labctl.units import parse_duration_ns, parse_rate, parse_size
    path = Path(cal_path) if cal_path else calibration.BUNDLED
    if calibrate:
        from labctl.estimate import labrun
        samples = [s for d in calibrate for s in labrun.samples(Path(d))]
        result = calibration.evaluate(samples)
        if path == calibration.BUNDLED and not cal_path:
            raise LabError("--calibrate would overwrite the bundled calibration",
                           "name a file with --calibration FILE (bench/calibrate_estimate.py rewrites the bundled one)")
        calibration.save(result, samples, path, f"labctl estimate --calibrate {' '.join(calibrate)}")
        for r in result["rows"]:
            click.echo(f"{r['run']:<40} {r['collective']:>15} {r['ranks']:>4} ranks  measured {r['measured_s']:8.3f} s  "
                       f"model {r['predicted_s']:8.3f} s  leave-one-out {r['loo_error']:+.1%}")
        click.echo(f"written {path}: eta {result['params']['eta']:.3f}, error max {result['max_error']:.1%}, "
                   f"mean {result['mean_error']:.1%}")
        return
    cal = calibration.load(path)
    if check:
        rows, ok = report.check_runs(list(check), cal)
        allowed = report.allowed_error(cal)
        if as_json:
            click.echo(json.dumps({"rows": rows, "max_error": cal["max_error"], "allowed_error": allowed, "ok": ok},
                                  indent=1))
        else:
            for r in rows:
                click.echo(f"{r['run']}: {r['collective']} {r['size']:,} B over {r['ranks']} ranks: measured "
                           f"{r['measured_s']:.3f} s, model {r['predicted_s']:.3f} s ({r['error']:+.1%}, "
                           f"{'within' if r['within'] else 'OUTSIDE'} the {allowed:.1%} allowed; "
                           f"ECMP placement {r['placement']})")
            click.echo(report.calibration_line(cal))
        if not ok:
            raise SystemExit(1)
        return
    nv = parse_rate(nvlink) if str(nvlink) not in ("0", "none") else 0
    fabric = Clos.for_gpus(gpus, gpus_per_server, radix, float(parse_rate(rate)), float(nv))
    order = report.ranks_order(fabric, ranks)
    alpha_s = parse_duration_ns(alpha) / 1e9
    params = Params(alpha_net_s=alpha_s, eta=calibration.params_of(cal).eta)
    result = report.estimate(fabric, collective, order, parse_size(size), params, qps, seeds, seed_mode)
    if as_json:
        click.echo(json.dumps({"fabric": report.describe(fabric), **result, "calibration": {
            k: cal[k] for k in ("params", "max_error", "mean_error", "provenance") if k in cal},
            "note": report.MODEL_NOTE}, indent=1))
        return
    click.echo(report.describe(fabric))
    click.echo(report.text(result, cal))
