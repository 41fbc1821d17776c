"""``python -m fedlib.flower run|deploy --algorithm fedavg --clients 20 ... [--json]``: one configuration
through Flower, in its simulation engine (``run``) or on its Deployment Runtime with a SuperLink and
``--nodes`` SuperNodes on this machine (``deploy``, :mod:`fedlib.flower.deploy`). Every
:class:`~fedlib.config.Config` field is an option, as in ``python -m fedlib run``; the result goes to
``data/results/flower/<runtime>/``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from fedlib.__main__ import _add_config_options, finite_json
from fedlib.cli import OneLineParser
from fedlib.config import Config, ConfigError, owners_of


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m fedlib.flower", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one configuration through Flower (or load its Flower result)")
    _add_config_options(r)
    r.add_argument("--cpus", type=int, default=None, help="CPUs the simulation may use (default: all)")
    r.add_argument("--client-cpus", type=int, default=1, help="CPUs (torch threads) per virtual client")
    r.add_argument("--force", action="store_true", help="retrain even if the Flower result exists")
    r.add_argument("--json", action="store_true", help="print the final metrics as one JSON line")
    r.add_argument("--verbose", action="store_true", help="Flower's and Ray's logs")
    r.add_argument("--no-progress", action="store_true")
    d = sub.add_parser("deploy", help="train one configuration on a local SuperLink and SuperNodes")
    _add_config_options(d)
    d.add_argument("--nodes", type=int, default=3, help="SuperNodes (clients are dealt out over them)")
    d.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take")
    d.add_argument("--keep", type=Path, default=None, help="keep the deployment's folder (logs) here")
    d.add_argument("--json", action="store_true", help="print the final metrics as one JSON line")
    d.add_argument("--no-progress", action="store_true")
    d.add_argument("--insecure", action="store_true",
                   help="no TLS and no SuperNode authentication (any local process can read and join)")
    # a deployment draws privacy noise and samples clients from OS entropy unless told otherwise
    # (None: the default; only an algorithm with a privacy mechanism reads it)
    d.set_defaults(randomness=None)
    args = parser.parse_args(argv)

    fields = {f.name for f in dataclasses.fields(Config)}
    try:
        given = {k: v for k, v in vars(args).items() if k in fields}
        if given.get("randomness", "") is None:
            private = given.get("algorithm", Config().algorithm) in owners_of("randomness")
            given["randomness"] = "secret" if private else "seeded"
        config = Config().replace(**given).validate()
        from fedlib.flower import check_supported, require_flower
        check_supported(config)
        require_flower()
    except (ConfigError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "deploy":
        from fedlib.flower.deploy import deploy
        try:
            result = deploy([config], nodes=args.nodes, timeout_s=args.timeout, progress=not args.no_progress,
                            keep=args.keep, secure=not args.insecure)[0]
        except (ValueError, RuntimeError, TimeoutError) as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 1
    else:
        from fedlib.flower.simulation import run_flower
        result = run_flower(config, force=args.force, cpus=args.cpus, client_cpus=args.client_cpus,
                            progress=not args.no_progress, verbose=args.verbose)
    final = result.final
    print(f"final round {final['round']}: test accuracy {final['test_acc']:.4f} ({result.path})",
          file=sys.stderr)
    if args.json:
        flower = result.meta["flower"]
        print(json.dumps(finite_json({
            "test_acc": final["test_acc"], "test_loss": final["test_loss"], "round": final["round"],
            "result_path": str(result.path), "config_key": config.key(), "engine": result.meta["engine"],
            "mode": flower.get("mode"), "transport": flower.get("transport"),
            "randomness": config.randomness, "startup_s": flower.get("startup_s"),
            "peak_rss_mb": flower.get("peak_rss_mb")}), allow_nan=False))
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m fedlib.flower"))
