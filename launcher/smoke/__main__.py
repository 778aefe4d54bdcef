"""``python -m launcher.smoke [--level quick|long] [--json] [--min-node-gbps X] [--slow-node-ratio R]``:
the cross-node preflight (launcher.smoke.cluster), as the program of a torch job:

    trainer-launcher torch -- -m launcher.smoke

Every rank takes part; rank 0 prints the result (a table, or JSON) and exits 138 when a node
pair or a node is slow, or the all-reduce sum is wrong. Its last line, and the termination
message's ``error`` (through torchrun's error file), name the slow node by hostname; the launcher
ends the job as retryable. The other ranks exit 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from launcher.core import settings
from launcher.core.outcome import CONFIG_ERROR, ConfigError
from launcher.core.settings import Override
from launcher.smoke.knobs import CLUSTER_KNOBS, NODE_KNOBS

_KNOBS = {"level": NODE_KNOBS["level"], **CLUSTER_KNOBS}


class PreflightFailed(Exception):
    """How a failed cross-node preflight reads in the termination message's error."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")
    for name, knob in _KNOBS.items():
        parser.add_argument(knob.flag, dest=name, help=f"{knob.help} [{knob.env}]")
    args = parser.parse_args(argv)
    from launcher.smoke.settings import SmokeSettings

    overrides = {
        name: Override(getattr(args, name), knob.flag)
        for name, knob in _KNOBS.items()
        if getattr(args, name) is not None
    }
    try:
        smoke = settings.load(SmokeSettings, overrides)
    except ConfigError as error:
        print(f"python -m launcher.smoke: error: {error}", file=sys.stderr)
        return CONFIG_ERROR
    return run(smoke, overrides, args.json)


def run(smoke, overrides: dict[str, Override], as_json: bool) -> int:
    from launcher.smoke import cluster, thresholds
    from launcher.smoke.job import outcome_of, table

    started = time.monotonic()
    hosts, checks, pairs = cluster.measure(cluster.PAIR_LEVELS[smoke.level])
    if checks is None:
        return 0
    checks += cluster.pair_checks(
        hosts,
        pairs,
        thresholds.plain(smoke, "min_node_gbps", overrides),
        thresholds.plain(smoke, "slow_node_ratio", overrides),
    )
    outcome = outcome_of(checks)
    if as_json:
        print(
            json.dumps(
                {
                    "nodes": hosts,
                    "level": smoke.level,
                    "seconds": round(time.monotonic() - started, 2),
                    "checks": [c.as_json() for c in checks],
                    "exitCode": outcome.exit_code,
                },
                indent=2,
            )
        )
    else:
        print(f"{len(hosts)} nodes: {', '.join(hosts)}; level {smoke.level}")
        print(table(checks))
    print(outcome.message, file=sys.stderr if outcome.exit_code else sys.stdout, flush=True)
    sys.stdout.flush()
    if outcome.exit_code:
        # torchrun's error file: the launcher puts its message in the TrainJob's termination
        # message ("error"), so the slow node's name reaches it and not only the logs.
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(PreflightFailed(outcome.message.removeprefix("preflight failed: ")))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
