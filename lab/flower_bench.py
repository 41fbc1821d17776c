"""``python -m lab.flower_bench [--save]``: time and memory of fedlib's engine and of Flower
on the Flower page's configurations (seed 0 of FedAvg and of MOON-DPAP with client-level DP), through
Flower's simulation and its deployment runtime (local SuperNodes), measured one after the other on
this machine; see :mod:`fedlib.flower.bench`. Needs the Flower
extra. The book's Flower page shows the committed file (``data/bench/flower/``)."""

from __future__ import annotations

import json
import sys

from fedlib.cli import OneLineParser


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.flower_bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="quick", help="profile of the configurations (default: quick)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per measurement (default: 10)")
    p.add_argument("--cpus", type=int, default=None, help="CPUs the simulation may use (default: all)")
    p.add_argument("--nodes", type=int, default=3,
                   help="time a deployment run on this many local SuperNodes too (default: 3; 0: none)")
    p.add_argument("--save", action="store_true", help="write data/bench/flower/<device>-<date>.json")
    args = p.parse_args(argv)
    if args.nodes < 0:
        p.error("--nodes must be >= 0")
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (the first round is left out of the per-round time)")

    from fedlib.flower import require_flower

    require_flower()
    from fedlib.flower.bench import compare, save
    from studies import flower as page

    configs = page.configs(args.profile, 1)
    chosen = {label: configs[label][0].replace(rounds=args.rounds) for label in ("FedAvg", page.DP_LABEL)}
    rows = compare(chosen, cpus=args.cpus, nodes=args.nodes)
    for row in rows:
        print(json.dumps(row))
    if args.save:
        print(f"saved {save(rows)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.flower_bench"))
