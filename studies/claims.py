"""Verdicts as data: the classes of the claims ledger and the statistical rules that assign them.

Every claim a page tests ends as one :class:`Finding` (claim, what we measured, a
:class:`Verdict` class, and the reason in words). The classes mean one thing each:

* ``reproduced``: our evidence agrees with the claim (a number inside its tolerance, an
  ordering that holds across seeds);
* ``partly``: the direction holds but the size does not, or a statement is valid but loose;
* ``not reproduced``: our evidence contradicts the claim (including runs that fail: a model at
  chance under the paper's recipe is a finding, not a caveat);
* ``inconclusive``: our evidence cannot decide, with the reason (too few seeds, a reduced profile
  for an absolute number, a gap inside the noise);
* ``not testable``: the paper omits what a test needs;
* ``sanity check``: true by construction (shown, not counted as evidence for the paper);
* ``not evaluated``: the ``smoke`` profile (a few rounds on a few hundred samples) says nothing.

Statistics. A number is compared through the 95 % t-interval of its mean over seeds; an
ordering or a gap between two methods through the 95 % t-interval of their paired differences
(same seed: same data, partition and initial model). One seed gives no interval: such claims
are inconclusive. Published numbers come without a spread, so each number claim states its
tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

import numpy as np
from scipy import stats


class Verdict(StrEnum):
    REPRODUCED = "reproduced"
    PARTLY = "partly"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTABLE = "not testable"
    SANITY = "sanity check"
    NOT_EVALUATED = "not evaluated"


#: Methods and variants as a reader knows them (keys of the pages' run tables -> names).
METHOD_NAMES = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "feddyn": "FedDyn", "moon": "MOON",
    "ditto": "Ditto", "moon_dpap": "MOON-DPAP", "dp_fedavg": "DP-FedAvg", "ldp_fl": "LDP-FL",
    "signds_fl": "SignDS-FL", "fdl": "FDL", "fdl_corrected": "corrected FDL", "noldp": "FedAvg without LDP",
    "full": "full MOON-DPAP", "no_dynamic_lr": "without dynamic LR", "no_dropout": "without dropout",
    "no_pruning": "without pruning", "no_all_three": "without all three",
}


def name_of(key) -> str:
    """A method's (or variant's) name for a reader; other keys as they print."""
    return METHOD_NAMES.get(key, f"{key:g}" if isinstance(key, float) else str(key))


#: The classes that count as evidence about a paper.
EVIDENCE = (Verdict.REPRODUCED, Verdict.PARTLY, Verdict.NOT_REPRODUCED)

def seeds(n: int) -> str:
    """``n`` seeds in words ("1 seed", "3 seeds")."""
    return f"{n} seed{'s' if n != 1 else ''}"


#: Seeds an ordering or a gap needs before it can be judged.
MIN_SEEDS = 3


@dataclass(frozen=True)
class Finding:
    """One claim's verdict. ``scope`` is empty for evidence about the paper; otherwise it says what
    the row measures instead: this implementation (its cost, the accountant the study uses) or the
    study's own reading of a mechanism the paper leaves unspecified. Such rows keep their verdict
    and are shown, but the ledger counts them apart, not as evidence for or against the paper."""

    claim: str
    ours: str
    verdict: Verdict
    reason: str = ""
    scope: str = ""
    #: The profile and seeds this claim was graded at when they are not its page's: a claim whose
    #: runs are complete at the papers' scale while its page still renders at a smaller profile
    #: (:func:`studies.common.settled_beyond`). Empty: the page's.
    profile: str = ""
    seeds: int | None = None
    #: A sub-row: the paper claim this row is part of (one claim graded in several federations, values
    #: of r or with its controls), and how the ledger combines it into that claim's one verdict
    #: (:data:`ROLES`). Empty: a claim of its own. The ledger counts each paper claim once
    #: (:func:`studies.ledger.collect` writes the parent row from its sub-rows).
    part_of: str = ""
    role: str = ""

    def row(self) -> dict[str, str]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        if not self.profile:  # the page's profile: nothing to record per finding
            del d["profile"], d["seeds"]
        if not self.part_of:  # a claim of its own
            del d["part_of"], d["role"]
        return d


#: How a sub-row enters its claim's verdict: ``any`` (the claim holds where one of them holds: the
#: paper leaves open which setting it ran, e.g. its Dirichlet alpha), ``all`` (the claim is made for
#: each of them, e.g. every r of a table), ``context`` (shown beside the claim, never deciding it: a
#: control, an implied level).
ROLES = ("any", "all", "context")


def part(finding: Finding, parent: str, role: str) -> Finding:
    """``finding`` as a sub-row of the paper claim ``parent`` (:attr:`Finding.part_of`) in ``role``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return replace(finding, part_of=parent, role=role)


def combine(claim: str, rows: Sequence[Finding]) -> Finding:
    """One paper claim's verdict from its sub-rows (:func:`part`): the ``all`` rows as :func:`all_of`
    combines them, the ``any`` rows as alternatives (reproduced where one reproduces, not reproduced
    only where every one fails), ``context`` rows left out; the reason names each deciding row."""
    deciding = [f for f in rows if f.role != "context"]
    if not deciding:
        raise ValueError(f"{claim!r} has no deciding sub-row")
    verdicts = [f.verdict for f in deciding]
    each = "; ".join(f"{_sub_label(f.claim, claim)}: {f.verdict.value}" for f in deciding)
    ours = "; ".join(f"{_sub_label(f.claim, claim)}: {f.ours}" for f in deciding)
    if all(v is Verdict.NOT_EVALUATED for v in verdicts):
        return not_evaluated(claim, ours)
    if any(f.role == "all" for f in deciding):
        found = all_of(claim, deciding)
        return Finding(claim, ours, found.verdict, f"graded at each of {len(deciding)} ({each})")
    if Verdict.REPRODUCED in verdicts:
        verdict = Verdict.REPRODUCED
    elif all(v is Verdict.NOT_REPRODUCED for v in verdicts):
        verdict = Verdict.NOT_REPRODUCED
    elif Verdict.PARTLY in verdicts:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.INCONCLUSIVE
    how = ("not reproduced in any" if verdict is Verdict.NOT_REPRODUCED else
           "reproduced in at least one" if verdict is Verdict.REPRODUCED else "graded in each")
    return Finding(claim, ours, verdict,
                   f"{how} of the {len(deciding)} settings the paper leaves open ({each})")


def _sub_label(sub: str, parent: str) -> str:
    """What a sub-row adds to its claim's text ("(Dirichlet alpha = 0.1)"), or its whole text."""
    rest = sub.removeprefix(parent).strip() if sub.startswith(parent) else sub
    return rest.strip("()[]: ") or sub


#: Scopes of rows that are not evidence about the paper (see :class:`Finding`).
IMPLEMENTATION = "measures this implementation, not the paper"


#: The profile of a finding computed from the settings alone: no runs, no seeds.
ANALYTIC = "analytic"


def graded_at(finding: Finding, profile: str, seeds: int) -> Finding:
    """``finding`` marked as graded at ``profile`` with ``seeds`` seeds (a larger profile than its
    page's, :attr:`Finding.profile`); an analytic finding stays analytic, without seeds."""
    if finding.profile == ANALYTIC:
        return finding
    return replace(finding, profile=profile, seeds=seeds)


def analytic(finding: Finding) -> Finding:
    """``finding`` marked as computed from the settings, without runs (:data:`ANALYTIC`)."""
    return replace(finding, profile=ANALYTIC, seeds=None)


def about(finding: Finding, scope: str) -> Finding:
    """``finding`` marked as being about ``scope`` (:class:`Finding`), not the paper."""
    return replace(finding, scope=scope)


def our_reading(reading: str) -> str:
    """The scope of a row that holds only under the study's ``reading`` of an unspecified mechanism."""
    return f"holds under our reading of what the paper leaves open: {reading}"


# ---- statistics ---------------------------------------------------------------------------------
def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided t-interval; one value gives an unbounded interval."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, -math.inf, math.inf
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def paired_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % interval of ``a - b`` paired by seed."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need one per seed on both sides, got {a.shape} and {b.shape}")
    return mean_ci(a - b)


def interval(m: float, lo: float, hi: float, unit: str = "") -> str:
    if not math.isfinite(m):  # no finite estimate (too few rounds or a diverged run): no number
        return "n/a"
    if not math.isfinite(lo):
        return f"{m:.2f}{unit} (one seed)"
    return f"{m:.2f}{unit} [{lo:.2f}, {hi:.2f}]"


def not_evaluated(claim: str, ours: str = "") -> Finding:
    return Finding(
        claim,
        ours or "smoke run",
        Verdict.NOT_EVALUATED,
        "the smoke profile (2 rounds on a few hundred samples) is for the tests, not evidence",
    )


# ---- rules ---------------------------------------------------------------------------------------
def number(
    claim: str, published: float, values: Sequence[float], profile: str, tolerance: float, unit: str = " %"
) -> Finding:
    """A published number: reproduced when the 95 % interval of our mean lies within
    ``published +/- tolerance``, not reproduced when it lies entirely outside, else inconclusive.
    An absolute number needs the paper's setting: other profiles are inconclusive."""
    m, lo, hi = mean_ci(values)
    ours = (
        f"{interval(m, lo, hi, unit)} over {seeds(len(values))}; paper {published:g}{unit} ± {tolerance:g}"
    )
    if profile == "smoke":
        return not_evaluated(claim, ours)
    if profile != "paper":
        return Finding(
            claim,
            ours,
            Verdict.INCONCLUSIVE,
            f"the {profile} profile reduces data and rounds: an absolute number needs the paper profile",
        )
    if len(values) < 2:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, "one seed: no interval")
    if published - tolerance <= lo and hi <= published + tolerance:
        return Finding(claim, ours, Verdict.REPRODUCED, f"the 95 % interval lies within ±{tolerance:g}")
    if hi < published - tolerance or lo > published + tolerance:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, f"the 95 % interval lies outside ±{tolerance:g}")
    return Finding(claim, ours, Verdict.INCONCLUSIVE, "the 95 % interval overlaps the tolerance band")


#: How far (points) an ordering's interval must lie from 0 to be decisive at a profile that cuts the
#: rounds of a method whose schedules depend on the number of rounds T (MOON-DPAP's cosine learning
#: rate, its tau and mu ramps, its pruning threshold, its eq. 5 DP schedule): there a method runs a
#: compressed version of its schedule, so a small gap says little about the paper's setting.
DECISIVE_MARGIN = 5.0


def margin_reason(profile: str, cut: str | None = None) -> str | None:
    """Why an ordering at ``profile`` must clear :data:`DECISIVE_MARGIN` (None at ``paper``, where it
    need not, and at ``smoke``, which judges nothing): one rule for every study. ``cut`` is the
    study's own reason (e.g. MOON-DPAP's schedules compressed into fewer rounds); without one, the
    reduced setting itself is the reason."""
    if profile in ("paper", "smoke"):
        return None
    return cut or (f"the {profile} profile reduces the paper's data, rounds or model, so a small gap "
                   "need not carry over to the paper's setting")


def ordering(
    claim: str,
    better: Sequence[float],
    worse: Sequence[float],
    profile: str,
    what: str = "difference",
    unit: str = " pts",
    cut: str | None = None,
) -> Finding:
    """``better > worse``, paired by seed: reproduced when the 95 % interval of the differences is
    above 0, not reproduced when it is below 0, else inconclusive (gap inside the noise). ``cut``: why
    this profile distorts the comparison (rounds cut under T-dependent schedules); then, away from
    the paper profile, the interval must clear :data:`DECISIVE_MARGIN` either way, else the ordering
    is inconclusive at this profile; without ``cut`` the same margin applies away from the paper
    profile for the generic reason of :func:`margin_reason` (one rule for every study)."""
    m, lo, hi = paired_ci(better, worse)
    ours = f"{what} {interval(m, lo, hi, unit)}, {seeds(len(better))}"
    if profile == "smoke":
        return not_evaluated(claim, ours)
    if len(better) < MIN_SEEDS:
        return Finding(
            claim, ours, Verdict.INCONCLUSIVE, f"{seeds(len(better))}: an ordering needs {MIN_SEEDS}"
        )
    why = margin_reason(profile, cut)
    if why and not (lo > DECISIVE_MARGIN or hi < -DECISIVE_MARGIN):
        return Finding(claim, ours, Verdict.INCONCLUSIVE,
                       f"inconclusive at this profile: {why}; an ordering needs its 95 % interval beyond "
                       f"±{DECISIVE_MARGIN:g} points here")
    if lo > 0:
        return Finding(
            claim, ours, Verdict.REPRODUCED, "the 95 % interval of the paired differences is above 0"
        )
    if hi < 0:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, "the opposite ordering holds (interval below 0)")
    return Finding(claim, ours, Verdict.INCONCLUSIVE, "the gap is inside the noise (interval contains 0)")


def best_of(claim: str, best: str, by_seed: Mapping[str, Sequence[float]], profile: str,
            cut: str | None = None) -> Finding:
    """``best`` beats every other method, each comparison paired by seed (all must hold); ``cut`` as
    in :func:`ordering`."""
    results = {k: ordering(claim, by_seed[best], v, profile, cut=cut)
               for k, v in by_seed.items() if k != best}
    ours = "; ".join(f"vs {name_of(k)}: {f.ours}" for k, f in results.items())
    if profile == "smoke":
        return not_evaluated(claim, ours)
    behind = [k for k, f in results.items() if f.verdict is Verdict.NOT_REPRODUCED]
    if behind:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                       f"significantly behind {', '.join(map(name_of, behind))}")
    open_ = [k for k, f in results.items() if f.verdict is not Verdict.REPRODUCED]
    if not open_:
        return Finding(claim, ours, Verdict.REPRODUCED, "ahead of every other method across seeds")
    cut_open = [k for k in open_ if results[k].reason.startswith("inconclusive at this profile")]
    first = cut_open[0] if cut_open else open_[0]
    return Finding(claim, ours, Verdict.INCONCLUSIVE, f"vs {name_of(first)}: {results[first].reason}")


#: Two methods whose results differ by at most this many points in every seed are the same run in
#: effect: "close" is then true by construction (a term that is inert at the setting), a sanity check.
INERT = 0.05


def close(
    claim: str, a: Sequence[float], b: Sequence[float], margin: float, profile: str, what: str = "difference",
    inert_reason: str | None = None,
) -> Finding:
    """``|a - b| <= margin``, paired by seed: reproduced when the whole 95 % interval lies within
    ``+/- margin``, not reproduced when it lies entirely outside, else inconclusive. When the two agree
    to :data:`INERT` points in every seed and ``inert_reason`` says why they must (a term inert at this
    setting), the claim is a sanity check, not a reproduction."""
    m, lo, hi = paired_ci(a, b)
    ours = f"{what} {interval(m, lo, hi, ' pts')}, {len(a)} seeds; margin ±{margin:g}"
    if profile == "smoke":
        return not_evaluated(claim, ours)
    # (1e-9: the differences of percentages carry float rounding; 0.05 is one test image in 2,000)
    if inert_reason and len(a) and float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= INERT + 1e-9:
        return Finding(claim, ours, Verdict.SANITY,
                       f"the two agree to {INERT:g} points in every seed: {inert_reason}; true by "
                       "construction, not evidence")
    if len(a) < MIN_SEEDS:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, f"{seeds(len(a))}: a comparison needs {MIN_SEEDS}")
    if -margin <= lo and hi <= margin:
        return Finding(claim, ours, Verdict.REPRODUCED, f"the 95 % interval lies within ±{margin:g} points")
    if lo > margin or hi < -margin:
        return Finding(
            claim, ours, Verdict.NOT_REPRODUCED, f"the 95 % interval lies beyond ±{margin:g} points"
        )
    return Finding(claim, ours, Verdict.INCONCLUSIVE, "the 95 % interval straddles the margin")


#: How far a measured gap may lie from a published one and still count as the same effect measured
#: loosely ("partly"): up to this factor above or below it (beyond the tolerance). A cost of 75.75
#: points measured against a claimed 6.6 is another effect, not a loose measurement of it.
GAP_FACTOR = 2.0


def gap(
    claim: str, published: float, a: Sequence[float], b: Sequence[float], profile: str, tolerance: float,
    cut: str | None = None,
) -> Finding:
    """A published gap ``a - b`` (paired by seed). At the paper profile: reproduced when the 95 %
    interval lies within ``published +/- tolerance``; not reproduced when the whole interval lies above
    :data:`GAP_FACTOR` times the claim or below the claim divided by that factor (each beyond the
    tolerance, whichever reaches further: ``max(2 size, size + tol)`` above, ``min(size / 2, size - tol)``
    below; the latter even when the interval holds 0: the claimed effect is then excluded);
    partly when the direction holds and the interval lies outside the band but within those factors.
    At other profiles only the direction can be tested: partly when it holds (the size needs the
    paper profile). Opposite sign: not reproduced. ``cut`` as in
    :func:`ordering`: away from the paper profile the direction must clear :data:`DECISIVE_MARGIN`."""
    m, lo, hi = paired_ci(a, b)
    ours = f"gap {interval(m, lo, hi, ' pts')}, {len(a)} seeds; paper {published:+g} ± {tolerance:g}"
    if profile == "smoke":
        return not_evaluated(claim, ours)
    if len(a) < MIN_SEEDS:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, f"{seeds(len(a))}: a gap needs {MIN_SEEDS}")
    if cut and profile != "paper" and not (lo > DECISIVE_MARGIN or hi < -DECISIVE_MARGIN):
        return Finding(claim, ours, Verdict.INCONCLUSIVE,
                       f"inconclusive at this profile: {cut}; a gap's direction needs its 95 % interval "
                       f"beyond ±{DECISIVE_MARGIN:g} points here")
    s_lo, s_hi = (lo, hi) if published >= 0 else (-hi, -lo)  # the gap in the published direction
    if s_hi < 0:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, "the gap has the opposite sign")
    size = abs(published)
    # the factor and the tolerance do not compound: beyond whichever of them reaches further
    above, below = max(GAP_FACTOR * size, size + tolerance), min(size / GAP_FACTOR, size - tolerance)
    if profile == "paper" and s_hi < below:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                       f"the whole 95 % interval lies below {below:g}, {1 / GAP_FACTOR:g} of the claimed "
                       f"{size:g} and beyond its tolerance (± {tolerance:g}): the claimed effect is excluded")
    if s_lo <= 0:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, "the gap is inside the noise (interval contains 0)")
    if profile != "paper":
        return Finding(
            claim,
            ours,
            Verdict.PARTLY,
            f"the direction holds; its size needs the paper profile, not {profile}",
        )
    if published - tolerance <= lo and hi <= published + tolerance:
        return Finding(claim, ours, Verdict.REPRODUCED, f"the 95 % interval lies within ±{tolerance:g}")
    if s_lo > above:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                       f"the direction holds but the size does not: the whole 95 % interval lies above "
                       f"{above:g}, {GAP_FACTOR:g} times the claimed {size:g} and beyond its tolerance "
                       f"(± {tolerance:g}), a different effect, not the same one measured loosely")
    if hi < published - tolerance or lo > published + tolerance:
        return Finding(
            claim, ours, Verdict.PARTLY, f"the direction holds; the size lies outside ±{tolerance:g}"
        )
    return Finding(
        claim, ours, Verdict.INCONCLUSIVE, "the direction holds; the size overlaps the tolerance band"
    )


def in_range(
    claim: str, low: float, high: float, values: Sequence[float], profile: str, unit: str = " %",
    absolute: bool = False,
) -> Finding:
    """A claimed range: reproduced when our 95 % interval lies within ``[low, high]``; partly when
    it lies beyond it on the same side of 0 (direction holds, size does not); not reproduced when
    it has the opposite sign; else inconclusive. ``absolute``: the range is a level of the paper's
    own setting (a share of its model's parameters, say), so, as for :func:`number`, other profiles
    are inconclusive."""
    m, lo, hi = mean_ci(values)
    ours = f"{interval(m, lo, hi, unit)} over {len(values)} measurement(s); claim [{low:g}, {high:g}]{unit}"
    if profile == "smoke":
        return not_evaluated(claim, ours)
    if absolute and profile != "paper":
        return Finding(claim, ours, Verdict.INCONCLUSIVE,
                       f"the {profile} profile reduces the model, data and rounds: a level of the paper's "
                       "setting needs the paper profile")
    if len(values) < 2:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, "one measurement: no interval")
    if low <= lo and hi <= high:
        return Finding(claim, ours, Verdict.REPRODUCED, "the 95 % interval lies within the claimed range")
    if hi < 0 < low or lo > 0 > high:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, "the effect has the opposite sign")
    if hi < low or lo > high:
        # a direction is graded only when the interval excludes the opposite (or no effect)
        signed = low > 0 or high < 0
        direction_holds = (lo > 0) if low > 0 else (hi < 0) if high < 0 else True
        if signed and not direction_holds:
            return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                           "the claimed range lies outside the 95 % interval, which does not even exclude no "
                           "effect: neither the size nor the direction holds")
        return Finding(
            claim, ours, Verdict.PARTLY, "the direction holds, the size is outside the claimed range"
        )
    return Finding(claim, ours, Verdict.INCONCLUSIVE, "the 95 % interval overlaps the claimed range's edge")


#: The largest total epsilon we call a meaningful guarantee: Ponomareva et al. (JAIR 2023, "How
#: to DP-fy ML") put epsilon <= 10 in the tier that still offers some protection and call larger
#: values little or none.
MEANINGFUL_EPSILON = 10.0


def reachable(
    claim: str,
    target: float,
    by_epsilon: Mapping[float, Sequence[float]],
    profile: str,
    tolerance: float,
    max_epsilon: float = MEANINGFUL_EPSILON,
    unit: str = " %",
) -> Finding:
    """A level (``target``, e.g. an accuracy) claimed under DP, tested along a frontier (values per
    seed at each total epsilon): reproduced when at some epsilon <= ``max_epsilon`` our 95 % interval
    lies above ``target - tolerance``; not reproduced when at every such epsilon it lies below;
    else inconclusive. A level needs the paper's setting: other profiles are inconclusive."""
    grid = sorted(e for e in by_epsilon if e <= max_epsilon)
    if not grid:
        raise ValueError(f"the frontier has no epsilon <= {max_epsilon:g}")
    cis = {e: mean_ci(by_epsilon[e]) for e in grid}
    best = max(grid, key=lambda e: cis[e][0])
    ours = (f"best at epsilon <= {max_epsilon:g}: {interval(*cis[best], unit)} at epsilon = {best:g} "
            f"({seeds(len(by_epsilon[best]))}); level {target:g}{unit} ± {tolerance:g}")
    if profile == "smoke":
        return not_evaluated(claim, ours)
    if profile != "paper":
        return Finding(claim, ours, Verdict.INCONCLUSIVE,
                       f"the {profile} profile reduces data and rounds: an accuracy level needs the "
                       "paper profile")
    if any(len(by_epsilon[e]) < 2 for e in grid):
        return Finding(claim, ours, Verdict.INCONCLUSIVE, "one seed: no interval")
    reached = [e for e in grid if cis[e][1] >= target - tolerance]
    if reached:
        return Finding(claim, ours, Verdict.REPRODUCED,
                       f"reached at epsilon = {min(reached):g} (95 % interval above {target - tolerance:g})")
    if all(cis[e][2] < target - tolerance for e in grid):
        return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                       f"below {target - tolerance:g} at every epsilon <= {max_epsilon:g}")
    return Finding(claim, ours, Verdict.INCONCLUSIVE, "the 95 % interval overlaps the tolerance band")


def peak(claim: str, at: Hashable, by_seed: Mapping, profile: str, cut: str | None = None) -> Finding:
    """The claimed value ``at`` gives the highest result: its paired differences to every other
    value must all be above 0 (reproduced); another value significantly ahead of it: not
    reproduced; otherwise inconclusive. Away from the paper profile each difference must clear
    :data:`DECISIVE_MARGIN`, as an ordering's (:func:`margin_reason`)."""
    others = [k for k in by_seed if k != at]
    cis = {k: paired_ci(by_seed[at], by_seed[k]) for k in others}
    ours = "; ".join(f"vs {name_of(k)}: {interval(*ci, ' pts')}" for k, ci in cis.items())
    if profile == "smoke":
        return not_evaluated(claim, ours)
    n = len(by_seed[at])
    if n < MIN_SEEDS:
        return Finding(claim, ours, Verdict.INCONCLUSIVE, f"{seeds(n)}: a peak needs {MIN_SEEDS}")
    why = margin_reason(profile, cut)
    if why and not all(lo > DECISIVE_MARGIN or hi < -DECISIVE_MARGIN for _, lo, hi in cis.values()):
        return Finding(claim, ours, Verdict.INCONCLUSIVE,
                       f"inconclusive at this profile: {why}; each difference needs its 95 % interval "
                       f"beyond ±{DECISIVE_MARGIN:g} points here")
    if all(lo > 0 for _, lo, _ in cis.values()):
        return Finding(claim, ours, Verdict.REPRODUCED, "ahead of every other value across seeds")
    behind = [name_of(k) for k, (_, _, hi) in cis.items() if hi < 0]
    if behind:
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, f"significantly behind {', '.join(behind)}")
    return Finding(
        claim, ours, Verdict.INCONCLUSIVE, "the differences to the neighbours are inside the noise"
    )


def bound(
    claim: str, measured: Sequence[float], claimed: Sequence[float], tight: Sequence[float], ours: str
) -> Finding:
    """A claimed upper bound: violated by a measurement -> not reproduced (a bug or a wrong bound);
    holding but above the tight bound -> partly (valid but loose); equal to it -> reproduced."""
    measured, claimed, tight = (np.asarray(v, dtype=float) for v in (measured, claimed, tight))
    if np.any(measured > claimed):
        return Finding(claim, ours, Verdict.NOT_REPRODUCED, "a measurement exceeds the claimed bound")
    if np.any(claimed > tight * (1 + 1e-9)):
        return Finding(
            claim, ours, Verdict.PARTLY, "valid but loose: the claimed bound lies above the tight one"
        )
    return Finding(claim, ours, Verdict.REPRODUCED, "the claimed bound holds and is tight")


def at_chance(
    accuracy_pct: Sequence[float], chance_pct: float, untrained_pct: float | None = None, margin: float = 3.0
) -> bool:
    """True when the runs end within ``margin`` points of chance or of the untrained model."""
    m = float(np.mean(accuracy_pct))
    near = abs(m - chance_pct) <= margin
    return near or (untrained_pct is not None and abs(m - untrained_pct) <= margin)


def seeds_at_chance(accuracy_pct: Sequence[float], chance_pct: float) -> str:
    """A note for seeds that split: ``"k of n seeds end at chance (a, b, c %)"`` when some but not all
    of the runs end at chance (:func:`at_chance`, seed by seed), else empty. A mean and interval over
    seeds of which some learned and some collapsed says neither; the reader needs the seeds."""
    k = sum(at_chance([v], chance_pct) for v in accuracy_pct)
    if k in (0, len(accuracy_pct)):
        return ""
    each = ", ".join(f"{v:.1f}" for v in accuracy_pct)
    return f"{k} of {len(accuracy_pct)} seeds end at chance ({each} %)"


def split_seeds_reason(accuracy_pct: Sequence[float], chance_pct: float, published: float,
                       tolerance: float) -> str:
    """Why a number over seeds that split between chance and learning (:func:`seeds_at_chance`) is
    read seed by seed: their interval spans most of the possible accuracies and decides nothing, so
    the reason says how many seeds reach ``published +/- tolerance`` (and the best one when none
    does). Empty when the seeds do not split."""
    if not seeds_at_chance(accuracy_pct, chance_pct):
        return ""
    inside = sum(abs(v - published) <= tolerance for v in accuracy_pct)
    band = f"{published:g} % ± {tolerance:g}"
    reach = (f"no seed reaches {band} (best {max(accuracy_pct):.1f} %)" if not inside
             else f"{inside} of {len(accuracy_pct)} seeds within {band}")
    return f"the seeds split between chance and learning, so their interval decides nothing; {reach}"


def all_of(claim: str, findings: list[Finding]) -> Finding:
    """Several findings behind one claim: reproduced if all are, not reproduced if any is,
    the first non-reproduced reason otherwise."""
    ours = "; ".join(f.ours for f in findings)
    verdicts = [f.verdict for f in findings]
    if all(v is Verdict.NOT_EVALUATED for v in verdicts):
        return not_evaluated(claim, ours)
    if Verdict.NOT_REPRODUCED in verdicts:
        return Finding(
            claim,
            ours,
            Verdict.NOT_REPRODUCED,
            next(f.reason for f in findings if f.verdict is Verdict.NOT_REPRODUCED),
        )
    if all(v is Verdict.REPRODUCED for v in verdicts):
        return Finding(claim, ours, Verdict.REPRODUCED, findings[0].reason)
    if all(v in (Verdict.REPRODUCED, Verdict.PARTLY) for v in verdicts):
        return Finding(
            claim, ours, Verdict.PARTLY, next(f.reason for f in findings if f.verdict is Verdict.PARTLY)
        )
    first = next(f for f in findings if f.verdict is not Verdict.REPRODUCED)
    return Finding(claim, ours, first.verdict, first.reason)


# ---- claims about an under-specified mechanism: one row per reading the text admits (issue 63) -----------
@dataclass(frozen=True)
class Reading:
    """One reading of a mechanism the paper leaves unspecified: its name, the neighbouring relation
    it protects, and the guarantee it gives (``valid`` False: none holds, say why in ``guarantee``)."""

    name: str
    relation: str
    guarantee: str
    valid: bool = True


def reading_row(claim: str, reading: Reading, finding: Finding) -> Finding:
    """``finding`` (graded under ``reading``) as the claim's row for that reading: the claim names the
    reading, the row is scoped to it (counted apart from the evidence about the paper) and says its
    relation and guarantee."""
    scope = our_reading(f"{reading.name} ({reading.relation}; {reading.guarantee})")
    return Finding(f"{claim} [reading: {reading.name}]", finding.ours, finding.verdict, finding.reason, scope,
                   finding.profile, finding.seeds)


def by_readings(claim: str, rows: Sequence[tuple[Reading, Finding]]) -> Finding:
    """A claim about an under-specified mechanism, from its rows per reading: reproduced when a reading
    with a valid guarantee reproduces it; partly when only readings without one do and every reading
    with one fails (the number comes back, the privacy does not); not reproduced only when every
    admitted reading fails; otherwise inconclusive, naming the readings still open (a reading with a
    valid guarantee still open keeps the claim open, even where one without reproduces it)."""
    verdicts = [(r, f.verdict) for r, f in rows]
    ours = "; ".join(f"{r.name}: {f.ours}" for r, f in rows)
    if rows and all(v is Verdict.NOT_EVALUATED for _, v in verdicts):
        return not_evaluated(claim, ours)
    valid = [r.name for r, v in verdicts if v is Verdict.REPRODUCED and r.valid]
    if valid:
        return Finding(claim, ours, Verdict.REPRODUCED, f"reproduced under {', '.join(valid)}")
    invalid = [r.name for r, v in verdicts if v is Verdict.REPRODUCED]
    open_valid = [r.name for r, v in verdicts if r.valid and v is not Verdict.NOT_REPRODUCED]
    back = f"the number comes back only under {', '.join(invalid)}, which has no valid privacy guarantee"
    if invalid and not open_valid:
        return Finding(claim, ours, Verdict.PARTLY, f"{back}; under every reading with one it does not")
    if rows and all(v is Verdict.NOT_REPRODUCED for _, v in verdicts):
        why = "; ".join(f"{r.name}: {f.reason}" for r, f in rows)
        return Finding(claim, ours, Verdict.NOT_REPRODUCED,
                       f"not reproduced under any of the {len(rows)} readings the text admits ({why})")
    open_ = [r.name for r, v in verdicts if v is not Verdict.NOT_REPRODUCED and r.name not in invalid]
    failed = [r.name for r, v in verdicts if v is Verdict.NOT_REPRODUCED]
    return Finding(claim, ours, Verdict.PARTLY if any(v is Verdict.PARTLY for _, v in verdicts)
                   else Verdict.INCONCLUSIVE,
                   f"open under {', '.join(open_)}"
                   + (f"; fails under {', '.join(failed)}" if failed else "")
                   + (f"; {back}" if invalid else ""))


def sanity(claim: str, ours: str, why: str) -> Finding:
    return Finding(claim, ours, Verdict.SANITY, why)


def not_testable(claim: str, ours: str, why: str) -> Finding:
    return Finding(claim, ours, Verdict.NOT_TESTABLE, why)


def failure(claim: str, ours: str, why: str) -> Finding:
    """A run that fails under the paper's recipe (diverges, NaN, ends at chance): a finding."""
    return Finding(claim, ours, Verdict.NOT_REPRODUCED, why)
