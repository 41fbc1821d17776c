"""Command line: ``python -m fedlib run --algorithm fedavg --clients 20 ... [--json]``.

Every :class:`~fedlib.config.Config` field is an option (``--field-name``); ``python -m fedlib
data`` fetches the datasets. (The studies' profiles, which shrink a paper's setting to a machine,
are listed by ``python -m studies profiles``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from fedlib.cli import OneLineParser
from fedlib.config import Config, ConfigError
from fedlib.engine import PATHS


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def finite_json(value):
    """``value`` with every non-finite float as ``None``, so that ``json.dumps`` writes valid JSON
    (a diverged run's NaN loss is ``null``, not the bare ``NaN`` JSON does not allow)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _add_config_options(p: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(Config):
        opt = "--" + f.name.replace("_", "-")
        kind = type(f.default)
        helptext = f"{f.metadata['help']} (default: {f.default})"
        if kind is bool:
            p.add_argument(opt, dest=f.name, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=helptext)
        else:
            p.add_argument(opt, dest=f.name, type=kind, default=argparse.SUPPRESS, help=helptext)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m fedlib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    r = sub.add_parser("run", help="train one configuration (or load it from the cache)")
    _add_config_options(r)
    r.add_argument("--engine", default="auto", choices=["auto", *PATHS],
                   help="engine path (auto: vectorized on a GPU, parallel on a multi-core CPU)")
    r.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    r.add_argument("--force", action="store_true", help="retrain even if the result is cached")
    r.add_argument("--checkpoint-every", type=_positive_int, default=5,
                   help="rounds between checkpoints (>= 1)")
    r.add_argument("--json", action="store_true",
                   help="print the final metrics and result path as one JSON line at the end")
    r.add_argument("--no-progress", action="store_true")

    d = sub.add_parser("data", help="fetch and verify datasets")
    d.add_argument("names", nargs="*", default=["fashionmnist", "mnist"])
    args = parser.parse_args(argv)

    if args.command == "data":
        from fedlib.data import DataUnavailableError, fetch
        try:
            for name in args.names:
                fetch(name)
        except DataUnavailableError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0

    fields = {f.name for f in dataclasses.fields(Config)}
    explicit = {k: v for k, v in vars(args).items() if k in fields}
    try:
        config = Config().replace(**explicit).validate()
    except ConfigError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return 2

    from fedlib.run import DeviceError, pick_device, run
    try:
        pick_device(args.device)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        result = run(config, engine=args.engine, device=args.device, force=args.force,
                     checkpoint_every=args.checkpoint_every, progress=not args.no_progress)
    except (OSError, ValueError) as e:  # an unwritable results folder, a refused input
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    final = result.final
    print(f"final round {final['round']}: test accuracy {final['test_acc']:.4f}, "
          f"test loss {final['test_loss']:.4f} ({result.path})", file=sys.stderr)
    if args.json:
        print(json.dumps(finite_json({
            "test_acc": final["test_acc"], "test_loss": final["test_loss"], "round": final["round"],
            "result_path": str(result.path), "config_key": config.key(),
            "duration_s": result.meta["duration_s"], "device": result.meta["device"],
            "engine": result.meta["engine"], "diverged": result.meta.get("diverged", False)}),
            allow_nan=False))
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m fedlib"))
