"""One way to write a number for a reader, used by every table of the book (issue 43).

* a float keeps :data:`SIG` significant figures and drops trailing zeros (0.015, 0.0005, 83.6,
  12,346), with thousands separators; below 1e-4 or from 1e6 on it is written in powers of ten
  (1.6 × 10⁶, 1 × 10⁻⁵), never as ``1.6e+06``;
* in a column (:func:`column`) the numbers share their count of decimals where their magnitudes
  are alike (0.015, 0.012, 0.010, 0.008), so that equal-looking cells are equal values;
* an integer is exact (12,000); zero is 0; a boolean is yes / no; a missing value is "n/a";
* an infinite privacy budget is "∞ (no guarantee)" (no DP, or a mechanism without a finite
  bound), never 0, which would read as perfect privacy; other infinities are ∞.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import numpy as np

#: Significant figures of a float.
SIG = 3
#: Below this magnitude (and from :data:`BIG` on) a float is written in powers of ten.
SMALL, BIG = 1e-4, 1e6
#: A column's numbers share their decimals when their shortest forms need at most this many apart
#: and their magnitudes span at most :data:`DECADES` powers of ten (else 79,510.00 would stand beside
#: 0.10).
SPREAD = 2
DECADES = 2
NO_GUARANTEE = "∞ (no guarantee)"
MISSING = "n/a"

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _decimals(x: float, sig: int) -> int:
    """The decimals of ``x`` rounded to ``sig`` significant figures, trailing zeros dropped."""
    if x == 0:
        return 0
    d = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{d}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return len(text.split(".")[1]) if "." in text else 0


def _power_of_ten(x: float, sig: int) -> str:
    mantissa, exponent = f"{x:.{sig - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def number(x, sig: int = SIG, privacy: bool = False, decimals: int | None = None) -> str:
    """``x`` for a reader (see the module docstring); ``privacy``: ``x`` is a privacy budget, so
    infinity means no guarantee; ``decimals``: a fixed count (a column's) instead of the shortest."""
    if x is None:
        return MISSING
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if not _is_real(x):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return MISSING
    if math.isinf(x):
        return NO_GUARANTEE if privacy and x > 0 else ("∞" if x > 0 else "−∞")
    if x == 0:
        return "0"
    if abs(x) < SMALL or abs(x) >= BIG:
        return _power_of_ten(x, sig)
    return f"{x:,.{_decimals(x, sig) if decimals is None else decimals}f}"


def column(values: Iterable, sig: int = SIG, privacy: bool = False) -> list[str]:
    """A column of a table: each value as :func:`number` writes it, the finite floats written in
    plain decimals sharing one count of decimals when their shortest forms differ by at most
    :data:`SPREAD` and their magnitudes by at most :data:`DECADES` powers of ten (so 0.010 stands
    beside 0.015, not 0.01, and 79,510 beside 0.1, not 79,510.00)."""
    values = list(values)
    plain = [float(v) for v in values if _is_real(v) and not isinstance(v, (int, np.integer))
             and math.isfinite(float(v)) and v != 0 and SMALL <= abs(float(v)) < BIG]
    shared = None
    if plain:
        ds = [_decimals(v, sig) for v in plain]
        powers = [math.floor(math.log10(abs(v))) for v in plain]
        if max(ds) - min(ds) <= SPREAD and max(powers) - min(powers) <= DECADES:
            shared = max(ds)
    out = []
    for v in values:
        floaty = (_is_real(v) and not isinstance(v, (int, np.integer)) and math.isfinite(float(v))
                  and v != 0 and SMALL <= abs(float(v)) < BIG)
        out.append(number(v, sig, privacy, decimals=shared if floaty else None))
    return out


#: Greek letters written out in the studies' plain text (settings, reasons), and what a reader sees.
GREEK = {"epsilon": "ε", "eps": "ε", "eta": "η", "tau": "τ", "mu": "μ", "sigma": "σ", "delta": "δ",
         "alpha": "α", "gamma": "γ", "lambda": "λ", "rho": "ρ", "beta": "β"}
_SUBSCRIPT = str.maketrans("0123456789aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ")
_SUBSCRIPTABLE = set("0123456789aehijklmnoprstuvx")
_SYMBOL = re.compile(r"(?<![\w\\$])(" + "|".join(sorted(GREEK, key=len, reverse=True)) +
                     r"|[a-zA-Z])_([A-Za-z0-9]+)(?![\w(])")
#: A name written as code (a config key, a notebook's name): lowercase words joined by underscores.
IDENTIFIER = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
#: A name from the code (snake_case) inside text: not part of a path, a URL, an anchor, an assignment
#: or a call (the browser check flags one a reader sees outside code).
CODE_NAME = re.compile(r"(?<![\w./#:=-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/(-]|\.\w)")


def code_names(text: str, markdown: bool = False) -> str:
    """``text`` with its maths names as symbols (:func:`symbols`) and the names from the code that
    remain set as code (``<code>`` in HTML, backticks in Markdown); maths between dollars and what
    is already in backticks are left alone."""
    def wrap(m: re.Match) -> str:
        return f"`{m.group(0)}`" if markdown else f"<code>{m.group(0)}</code>"

    parts = re.split(r"(\$[^$]*\$|`[^`]*`|<code>.*?</code>)", symbols(text))
    return "".join(part if part[:1] in ("$", "`") or part.startswith("<code>") else CODE_NAME.sub(wrap, part)
                   for part in parts)


def symbols(text: str) -> str:
    """Plain-text maths names as a reader writes them: a Greek letter's name as the letter and a
    subscript in subscript characters where Unicode has them all (``epsilon_0`` -> ε₀, ``eta_min``
    -> ηₘᵢₙ, ``z_t`` -> zₜ), else after an underscore (``eta_g`` -> η_g). A one-letter name is taken
    as a symbol only with a subscript of at most two characters (``n_i``, not ``x_train``); maths
    between dollar signs is left alone."""
    def one(m: re.Match) -> str:
        name, sub = m.group(1), m.group(2)
        if name not in GREEK and len(sub) > 2:
            return m.group(0)
        base = GREEK.get(name, name)
        return base + (sub.translate(_SUBSCRIPT) if set(sub) <= _SUBSCRIPTABLE else "_" + sub)

    # maths between dollars is left to MathJax
    parts = re.split(r"(\$[^$]*\$)", str(text))
    return "".join(part if part.startswith("$") else _SYMBOL.sub(one, part) for part in parts)
