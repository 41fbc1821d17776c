"""``python -m studies profiles``: how each study scales its paper's setting at each profile."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["profiles"]:
        print("usage: python -m studies profiles", file=sys.stderr)
        return 2
    from studies.dpfl.settings import SCALES as DPFL
    from studies.fdl.settings import SCALES as FDL
    from studies.moon_dpap.settings import SCALES as MOON_DPAP

    for name, scales in (("MOON-DPAP", MOON_DPAP), ("FDL", FDL), ("DP-FL", DPFL)):
        print(name)
        for profile, s in scales.items():
            print(f"  {profile:6s} {s.description}")
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m studies"))
