"""A script that gives up before its first iteration with ``raise SystemExit("boom")`` (or, with ``--code N``,
``sys.exit(N)``), for tests/test_record_cli.py: nbox must report the script's own exit first, not a missing
iteration boundary."""

import argparse
import sys

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--code", type=int, default=None)
args = parser.parse_args()

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: loading the data set", file=sys.stderr, flush=True)
if args.code is not None:
    sys.exit(args.code)
raise SystemExit("boom: the data set is missing")
