"""Open the built book in headless Chromium and check every page.

``python -m lab.browser_check book/_build/html [--screenshots DIR]`` loads each HTML page
(after its scripts ran, so MathJax has typeset the math), and fails on:

* an image whose file is missing (or an ``<img>`` without a source);
* an internal link to a file that does not exist;
* raw, unrendered math left in the text (``$$``, ``\\(``, ``\\[``, ``\\begin{``) or a page with
  math markup but no typeset formula;
* a figure in the page's content without real alt text (empty, or a file name) or without a
  caption (every image must sit in a ``<figure>`` with a ``<figcaption>``);
* content wider than the page: after layout, the document scrolls sideways, an element of the
  article reaches past the right edge of the window (long commands must wrap), or a table is
  wider than the article's column, so that some of its columns scroll out of view;
* a table that shows pandas' row numbers (or any unnamed integer index) as its first column, or a
  verdict table's cell narrower than one of its words, which then breaks inside the word ("meth od",
  "profil e"; a hyphen is a break);
* on the summary page: a count of pages per profile that disagrees with the pages' own headers
  (:func:`profile_counts_problem`);
* raw program output in the prose or tables (``inf``, ``NaN``, internal column names such as
  ``acc_mean``, a ``Config(...)`` repr, a Python dict or tuple, an ``<... object>`` repr), and a name
  from the code outside code, except on the API reference (:data:`CODE_PAGES`), which documents code;
* a figure shown so much smaller than its pixel width that its smallest text falls below 9 px
  (:data:`fedlib.plots.MIN_SCALE`);
* on a page with the privacy explorer: it must draw, have four sliders, change its readout when a
  slider moves (the script moves one), and draw no text under 10 px;

and saves one screenshot of each whole page (up to :data:`MAX_SHOT_HEIGHT` px), as a reader scrolls
through it. Needs Debian's ``chromium`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

from fedlib.cli import OneLineParser
from fedlib.plots import MIN_SCALE, MIN_TEXT_PX
from studies.numbers import CODE_NAME

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
REFRESH = re.compile(r'http-equiv="refresh"[^>]*content="\d+;\s*url=([^"]+)"', re.IGNORECASE)
RAW_MATH = re.compile(r"\$\$|\\\(|\\\[|\\begin\{")
SKIP_PAGES = {"genindex.html", "search.html"}
#: Pages that document code (the API reference, generated from docstrings): their names, signatures and
#: values are code by nature, so the two rules for prose (no name from the code outside code, no raw
#: program output) do not apply; every other check does.
CODE_PAGES = {"api.html"}


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _flags(profile_dir: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--no-first-run", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile_dir}", "--hide-scrollbars", "--window-size=1280,1400",
            "--virtual-time-budget=8000"]


#: Script added to a copy of each page: after layout (and MathJax), it records horizontal overflow.
PROBE = """<script>
function clipped(e, w) {
  for (var a = e.parentElement; a; a = a.parentElement) {
    var o = getComputedStyle(a).overflowX;
    var clips = o === "auto" || o === "scroll" || o === "hidden";
    if (clips && a.getBoundingClientRect().right <= w + 2) return true;
  }
  return false;
}
window.addEventListener("load", function () { setTimeout(function () {
  var w = document.documentElement.clientWidth, bad = [];
  document.querySelectorAll("article *").forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > w + 2 && !bad.length && !clipped(e, w)) {
      bad.push(e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ")[0] : "") +
               " reaches " + Math.round(r.right) + " px of " + w);
    }
  });
  if (document.documentElement.scrollWidth > w + 2) bad.push("the page scrolls sideways");
  var article = document.querySelector("article"), col = article ? article.clientWidth : w;
  document.querySelectorAll("article table").forEach(function (t, i) {
    var wide = Math.max(t.scrollWidth, t.getBoundingClientRect().width);
    if (t.scrollWidth > t.clientWidth + 2 || wide > col + 2) {
      bad.push("table " + (i + 1) + " is " + Math.round(wide) + " px wide in a " + col +
               " px column: some of it scrolls out of view");
    }
    var rows = Array.prototype.slice.call(t.rows);
    var head = rows.length ? rows[0].cells[0].textContent.trim() : "";
    if (rows.length > 2 && rows[0].cells.length > 1 && (head === "" || head === "index")) {
      var body = rows.slice(1), numbered = body.every(function (r, k) {
        return r.cells.length && /^\\d+$/.test(r.cells[0].textContent.trim()); });
      if (numbered) bad.push("table " + (i + 1) + " shows pandas' row numbers as its first column");
    }
    // a verdict table's cell narrower than one of its words breaks inside it (a column squeezed below
    // its words: "meth od", "profil e"); a hyphen is a break a reader expects
    var ctx = document.createElement("canvas").getContext("2d");
    var cells = t.classList.contains("ledger-claims") ? t.querySelectorAll("td, th") : [];
    Array.prototype.forEach.call(cells, function (cell) {
      var cs = getComputedStyle(cell);
      var room = cell.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      var walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT), node;
      while ((node = walk.nextNode())) {
        var es = getComputedStyle(node.parentElement);
        if (es.whiteSpace === "nowrap" || node.parentElement.closest("code, pre, mjx-container")) continue;
        ctx.font = es.fontStyle + " " + es.fontWeight + " " + es.fontSize + " " + es.fontFamily;
        node.textContent.split(/[\\s\\-\u2010-\u2014/]+/).forEach(function (word) {
          var w = word.replace(/^[^A-Za-z]+|[^A-Za-z]+$/g, "");
          if (/^[A-Za-z]{2,25}$/.test(w) && ctx.measureText(w).width > room + 1 && !bad.some(
              function (b) { return b.indexOf("table " + (i + 1) + " breaks") === 0; })) {
            bad.push("table " + (i + 1) + " breaks the word '" + w + "' inside a cell " + Math.round(room) +
                     " px wide");
          }
        });
      }
    });
  });
  document.querySelectorAll("article figure img").forEach(function (i) {
    if (i.naturalWidth > 0 && i.clientWidth / i.naturalWidth < SCALE) {
      bad.push("figure " + i.getAttribute("src").split("/").pop() + " shown at " +
               Math.round(100 * i.clientWidth / i.naturalWidth) + " % of its width: its smallest text " +
               "renders under MIN_PX px");
    }
  });
  // verdict badges: one colour per verdict class, wherever it is drawn (legend and tables), and no two
  // classes alike
  var colours = {};
  document.querySelectorAll("article .verdict").forEach(function (e) {
    var cls = String(e.className).split(" ").filter(function (c) {
      return c.indexOf("verdict-") === 0; })[0] || "(no verdict class)";
    (colours[cls] = colours[cls] || {})[getComputedStyle(e).backgroundColor] = true;
  });
  var seen = {};
  Object.keys(colours).forEach(function (cls) {
    var cs = Object.keys(colours[cls]);
    if (cs.length > 1) bad.push("the " + cls + " badge has " + cs.length + " colours: " + cs.join(", "));
    if (seen[cs[0]]) bad.push("the " + cls + " and " + seen[cs[0]] + " badges share the colour " + cs[0]);
    seen[cs[0]] = cls;
  });
  var m = document.createElement("div"); m.id = "fedlib-overflow-probe";
  m.setAttribute("data-overflow", bad.join("; "));
  m.setAttribute("data-height", String(document.documentElement.scrollHeight));
  document.body.appendChild(m);
}, 2500); });
</script>"""
PROBE_RESULT = re.compile(r'<div id="fedlib-overflow-probe"([^>]*)>')
#: Screenshots are of the whole page, up to this height (Chromium's largest surface is 16,384 px).
MAX_SHOT_HEIGHT = 16_000
FILE_NAME = re.compile(r"^[\w./-]+\.(png|svg|jpe?g|gif)$", re.IGNORECASE)
#: Raw program output a reader should never see in the prose or tables of a page: non-finite numbers,
#: internal column names, a config's repr, a Python dict.
RAW_OUTPUT = re.compile(r"(?<![\w.-])(-?inf|NaN|nan)(?![\w-])|acc_mean|acc_std|loss_mean|Config\(|"
                        r"\{'[a-z_]+': |<[\w.]+ object( at 0x[0-9a-f]+)?>|\('[\w .-]+', -?[\d.]+\)")
#: A name from the code (snake_case: ``held_out_rmse``, ``ldp_fl``) in prose or a table, outside
#: code: a reader should meet the thing's name (set as code where the code's name is meant).
SNAKE_CASE = CODE_NAME
#: A figure shown at less than this fraction of its pixel width draws text under 9 px (its smallest
#: text is fedlib.plots.MIN_FONT_PT at fedlib.plots.DPI: 0.72).
MIN_FIGURE_SCALE = MIN_SCALE

#: Script added to a copy of a page with the privacy explorer: it reads the explorer's readout, moves
#: its first slider, and records the readout before and after (and the sizes of its text).
EXPLORER_PROBE = """<script>
function texts() { return document.querySelectorAll("#EXPLORER_ID svg text"); }
function readout() {
  var t = []; texts().forEach(function (e) { t.push(e.textContent); }); return t.join(" | ");
}
function shown() {  // the values the page shows beside the sliders
  var t = []; document.querySelectorAll("#EXPLORER_ID .explorer-value").forEach(function (e) {
    if (e.offsetParent !== null) t.push(e.textContent); }); return t.join(" | ");
}
window.addEventListener("load", function () { setTimeout(function () {
  var before = readout(), valuesBefore = shown(), small = [];
  var inputs = document.querySelectorAll("#EXPLORER_ID input[type=range]");
  texts().forEach(function (e) {
    var px = parseFloat(getComputedStyle(e).fontSize);
    if (px < 10) small.push(e.textContent + " (" + px + " px)");
  });
  if (inputs.length) {
    var s = inputs[0]; s.value = String((Number(s.value) + 3) % (Number(s.max) + 1));
    s.dispatchEvent(new Event("input", {bubbles: true}));
    s.dispatchEvent(new Event("change", {bubbles: true}));
  }
  setTimeout(function () {
    var m = document.createElement("div"); m.id = "fedlib-explorer-probe";
    m.setAttribute("data-sliders", String(inputs.length));
    m.setAttribute("data-before", before); m.setAttribute("data-after", readout());
    m.setAttribute("data-small", small.join("; "));
    m.setAttribute("data-values", valuesBefore); m.setAttribute("data-valuesafter", shown());
    document.body.appendChild(m);
  }, 1500);
}, 3000); });
</script>"""
EXPLORER_RESULT = re.compile(r'<div id="fedlib-explorer-probe"([^>]*)>')


class _Page(HTMLParser):
    """Collects image sources, link targets, visible text, typeset-math markers, and the figures of
    the article (alt text, enclosing figure, caption)."""

    def __init__(self):
        super().__init__()
        self.images: list[str | None] = []
        self.links: list[str] = []
        self.text: list[str] = []
        self.typeset = 0
        self.math_markup = 0
        self.figures: list[dict] = []  # content images: src, alt, figure index or None
        self.captioned: set[int] = set()  # figures that contain a figcaption
        self._skip = 0  # depth inside script/style/typeset math, whose text is not prose
        self._article = 0
        self._figure: list[int] = []
        self._n_figures = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "article":
            self._article += 1
        elif tag == "figure":
            self._figure.append(self._n_figures)
            self._n_figures += 1
        elif tag == "figcaption" and self._figure:
            self.captioned.add(self._figure[-1])
        if tag == "img":
            self.images.append(a.get("src"))
            if self._article:
                self.figures.append({"src": a.get("src"), "alt": (a.get("alt") or "").strip(),
                                     "figure": self._figure[-1] if self._figure else None})
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag.startswith("mjx-"):
            self.typeset += tag == "mjx-container"
        cls = a.get("class") or ""
        if "math" in cls.split():
            self.math_markup += 1
        if tag in ("script", "style", "mjx-container", "mjx-assistive-mml", "code", "pre", "textarea"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "mjx-container", "mjx-assistive-mml", "code", "pre", "textarea"):
            self._skip = max(0, self._skip - 1)
        elif tag == "article":
            self._article = max(0, self._article - 1)
        elif tag == "figure" and self._figure:
            self._figure.pop()

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def _local_target(page: Path, ref: str, root: Path) -> Path | None:
    u = urlparse(ref)
    if u.scheme in ("http", "https", "mailto", "data", "javascript") or (not u.path and u.fragment):
        return None
    if u.scheme == "file":
        return Path(unquote(u.path))
    if not u.path:
        return None
    return (page.parent / unquote(u.path)).resolve()


def check_page(chromium: str, page: Path, root: Path, shots: Path | None) -> PageReport:
    rel = str(page.relative_to(root))
    report = PageReport(rel)
    redirect = REFRESH.search(page.read_text(errors="replace"))
    if redirect:  # e.g. index.html -> the root page: check the target exists (it is checked itself)
        target = _local_target(page, redirect.group(1), root)
        if target is not None and not target.exists():
            report.problems.append(f"redirect to a missing page {redirect.group(1)}")
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run([chromium, *_flags(prof), "--dump-dom", page.as_uri()], capture_output=True,
                             text=True, timeout=120)
        if dom.returncode != 0 or not dom.stdout.strip():
            report.problems.append(f"chromium could not load the page: {dom.stderr.strip()[-300:]}")
            return report
    overflow, height = ("", None) if redirect else _overflow(chromium, page)
    if shots is not None:  # the whole page, as a reader scrolls through it
        out = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
        with tempfile.TemporaryDirectory() as prof:
            flags = [f for f in _flags(prof) if not f.startswith("--window-size")]
            size = f"--window-size=1280,{min(max(height or 1400, 1400), MAX_SHOT_HEIGHT)}"
            subprocess.run([chromium, *flags, size, f"--screenshot={out}", page.as_uri()],
                           capture_output=True, timeout=120)
        if out.exists() and out.stat().st_size > 0:
            report.screenshot = out
        else:
            report.problems.append("no screenshot produced")
    if redirect:
        return report
    parsed = _Page()
    parsed.feed(dom.stdout)
    for src in parsed.images:
        if not src:
            report.problems.append("image without a source")
            continue
        target = _local_target(page, src, root)
        if target is not None and not target.exists():
            report.problems.append(f"missing image {src}")
    for href in parsed.links:
        target = _local_target(page, href, root)
        if target is not None and not target.exists():
            report.problems.append(f"broken internal link {href}")
    text = " ".join(parsed.text)
    raw = RAW_MATH.findall(text)
    if raw:
        i = RAW_MATH.search(text).start()
        report.problems.append(f"raw math in the text: ...{text[max(0, i - 40):i + 40]!r}...")
    if parsed.math_markup and not parsed.typeset:
        report.problems.append(f"{parsed.math_markup} math element(s) but no typeset formula "
                               "(MathJax did not run)")
    for fig in parsed.figures:
        name = Path(unquote(urlparse(fig["src"] or "").path)).name
        if not fig["alt"] or FILE_NAME.match(fig["alt"]) or fig["alt"] == name:
            report.problems.append(f"figure {name} without alt text (alt={fig['alt']!r})")
        if fig["figure"] is None or fig["figure"] not in parsed.captioned:
            report.problems.append(f"figure {name} without a caption")
    raw_out = RAW_OUTPUT.search(text) if page.name not in CODE_PAGES else None
    if raw_out:
        i = raw_out.start()
        report.problems.append(f"raw program output in the text: ...{text[max(0, i - 40):i + 40]!r}...")
    snake = SNAKE_CASE.search(text) if page.name not in CODE_PAGES else None
    if snake:
        i = snake.start()
        report.problems.append(f"a name from the code outside code: ...{text[max(0, i - 40):i + 40]!r}... "
                               "(name the thing, or set the name as code)")
    if overflow:
        report.problems.append(f"content wider than the page: {overflow}")
    html = page.read_text(errors="replace")
    for explorer in EXPLORERS:
        if f'id="{explorer}"' in html:
            report.problems.extend(explorer_problems(chromium, page, explorer))
    return report


#: The book's explorers: the id of their element -> (their sliders, a phrase their readout shows).
EXPLORERS = {"privacy-explorer": (4, "noise std on the average update"),
             "units-explorer": (4, "noise on the averaged update / largest signal")}


def explorer_problems(chromium: str, page: Path, explorer: str = "privacy-explorer") -> list[str]:
    """Load a copy of ``page`` with :data:`EXPLORER_PROBE` for the explorer ``explorer``
    (:data:`EXPLORERS`): it must draw its readout, have its sliders, which show their values (not their
    positions), change its readout and the value shown when a slider moves, and draw no text under
    10 px."""
    sliders, phrase = EXPLORERS[explorer]
    probe = EXPLORER_PROBE.replace("EXPLORER_ID", explorer)
    m = EXPLORER_RESULT.search(_dom_with(chromium, page, probe, ".explorer-"))
    name = "the privacy explorer" if explorer == "privacy-explorer" else f"the explorer #{explorer}"
    if m is None:
        return [f"{name} probe did not run"]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', m.group(1)))
    problems = []
    if attrs.get("sliders") != str(sliders):
        problems.append(f"{name} has {attrs.get('sliders')} sliders, not {sliders}")
    if phrase not in attrs.get("before", ""):
        problems.append(f"{name} drew no readout")
    elif attrs.get("before") == attrs.get("after"):
        problems.append(f"moving {name}'s slider changed nothing")
    if attrs.get("small"):
        problems.append(f"{name} has text under 10 px: {attrs['small'][:200]}")
    values = [v for v in attrs.get("values", "").split(" | ") if v]
    if len(values) != sliders or not all("=" in v for v in values):
        problems.append(f"{name}'s sliders do not show their values: {attrs.get('values')!r}")
    elif attrs.get("values") == attrs.get("valuesafter"):
        problems.append(f"moving {name}'s slider did not change the value shown beside it")
    return problems


def _overflow(chromium: str, page: Path) -> tuple[str, int | None]:
    """Load a copy of ``page`` with :data:`PROBE` added (beside it, so its relative links resolve)
    and return what the probe found ('' when nothing overflows) and the page's height in px."""
    if "</body>" not in page.read_text(errors="replace"):
        return "", None
    probe = PROBE.replace("MIN_PX", str(MIN_TEXT_PX)).replace("SCALE", str(MIN_FIGURE_SCALE))
    m = PROBE_RESULT.search(_dom_with(chromium, page, probe, ".probe-"))
    if m is None:
        return "the overflow probe did not run", None
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', m.group(1)))
    height = int(attrs["height"]) if attrs.get("height", "").isdigit() else None
    return attrs.get("overflow", "").replace("&gt;", ">").replace("&#39;", "'"), height


def _dom_with(chromium: str, page: Path, script: str, prefix: str) -> str:
    """The DOM headless Chromium dumps for a copy of ``page`` with ``script`` added (written beside
    it, so its relative links resolve, and removed afterwards)."""
    probe = page.with_name(f"{prefix}{page.name}")
    probe.write_text(_before_body_end(page.read_text(errors="replace"), script))
    try:
        with tempfile.TemporaryDirectory() as prof:
            return subprocess.run([chromium, *_flags(prof), "--dump-dom", probe.as_uri()],
                                  capture_output=True, text=True, timeout=120).stdout
    finally:
        probe.unlink(missing_ok=True)


def _before_body_end(html: str, script: str) -> str:
    """``script`` inserted before the page's *last* ``</body>`` (inlined JavaScript libraries may hold
    the string ``</body>`` themselves)."""
    head, tag, tail = html.rpartition("</body>")
    return head + script + tag + tail


def pages_of(html_root: Path) -> list[Path]:
    return sorted(p for p in html_root.rglob("*.html")
                  if p.name not in SKIP_PAGES and "_static" not in p.parts and "_sources" not in p.parts)


def check_book(html_root: Path, shots: Path | None = None, workers: int = 2) -> list[PageReport]:
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (apt-get install chromium)")
    html_root = html_root.resolve()
    if not (html_root / "index.html").exists():
        raise FileNotFoundError(f"{html_root}/index.html not found: build the book first (make book)")
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    pages = pages_of(html_root)
    with ThreadPoolExecutor(workers) as pool:
        reports = list(pool.map(lambda p: check_page(chromium, p, html_root, shots), pages))
    problem = profile_counts_problem(html_root)
    if problem:
        summary = next(r for r in reports if Path(r.page).name == "summary.html")
        summary.problems.append(problem)
    return reports


#: A page's header line (studies.common.profile_note): "**Profile `quick`**: ...".
HEADER_PROFILE = re.compile(r"<strong>Profile\s*<code[^>]*>(?:<span[^>]*>)?(\w+)")
#: The summary's count of pages per profile: "... on 21 pages: 8 rendered at `paper`, 13 rendered at ...".
SUMMARY_COUNT = re.compile(r"(\d+) rendered at\s*<code[^>]*>(?:<span[^>]*>)?(\w+)")


def profile_counts_problem(html_root: Path) -> str:
    """The summary page's pages per profile against the pages' own headers (issue 79): among the pages
    that show a verdict table (a ``ledger-claims`` table) and a profile header, how many say each
    profile. Empty when they agree, or when there is no summary page or no count on it."""
    summary = next((p for p in pages_of(html_root) if p.name == "summary.html"), None)
    if summary is None:
        return ""
    said = {prof: int(n) for n, prof in SUMMARY_COUNT.findall(summary.read_text(errors="replace"))}
    if not said:
        return ""
    headers: dict[str, int] = {}
    for page in pages_of(html_root):
        html = page.read_text(errors="replace")
        m = HEADER_PROFILE.search(html)
        if m and "ledger-claims" in html and page.name not in ("summary.html", "ledger.html"):
            headers[m.group(1)] = headers.get(m.group(1), 0) + 1
    if said != headers:
        fmt = lambda d: ", ".join(f"{n} at {p}" for p, n in sorted(d.items())) or "none"  # noqa: E731
        return f"the summary counts pages {fmt(said)}; the pages' own headers say {fmt(headers)}"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description="check the built book in headless Chromium")
    p.add_argument("html", type=Path, nargs="?", default=Path("book/_build/html"))
    p.add_argument("--screenshots", type=Path, default=Path("book/_build/screenshots"))
    args = p.parse_args(argv)
    reports = check_book(args.html, args.screenshots)
    bad = [r for r in reports if r.problems]
    for r in reports:
        print(f"{'FAIL' if r.problems else 'ok  '} {r.page}")
        for prob in r.problems:
            print(f"       {prob}")
    print(f"{len(reports)} pages, {len(bad)} with problems; screenshots in {args.screenshots}")
    return 1 if bad else 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.browser_check"))
