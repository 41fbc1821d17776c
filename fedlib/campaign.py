"""``python -m fedlib.campaign``: the same command as ``python -m fedlib.tools.campaign``.

Kept at this shorter path because the campaign is how the paper-scale results are made; the code
lives in :mod:`fedlib.tools.campaign`.
"""

import sys

from fedlib.tools.campaign import main

if __name__ == "__main__":
    sys.exit(main())
