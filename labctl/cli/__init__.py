"""The labctl command line: a thin layer over lifecycle/, topology/, plan/, traffic/, exports/ and the API."""
import signal

from labctl.cli import cluster, containers, estimate, inspect, lifecycle, pipeline, prompt, queueing, traffic  # noqa: F401  (registers commands)
from labctl.cli.base import cli


def main():
    # a stopped command unwinds as Ctrl-C does: a half-built lab rolls back, an experiment downs its
    # lab and a run stops its agents (the default SIGTERM would leave them to `labctl down`)
    signal.signal(signal.SIGTERM, _stop)
    cli(prog_name="labctl")


def _stop(signum, frame) -> None:
    # a second TERM must not cut the unwinding short; not SIG_IGN, which the helpers started while
    # unwinding would inherit through exec and then never stop on TERM
    signal.signal(signal.SIGTERM, _unwinding)
    raise SystemExit(128 + signum)


def _unwinding(signum, frame) -> None:
    pass
