#!/usr/bin/env python3
"""Open every page of the built book in headless Chromium and fail on any browser-side error.

    python .ci/check_html.py [_build/html]

Serves the HTML folder on 127.0.0.1, visits each page with Playwright driving the system
Chromium (/usr/bin/chromium, from Debian; Playwright never downloads a browser here), and
fails on console errors, uncaught page errors, failed or non-2xx local requests, and any
request that leaves localhost (the book must work offline).  On the chapters it also fails on a
table wider than the text column (clipped), an index column without a name, and a number printed
with an exponent ('1e+13') in the prose.  On every page it fails on TeX that reached the reader
unrendered (`tex_leaks`): a `$...$` span or a TeX command such as `\\mathrm` or `\\varphi` in
the visible text, outside math, code and signatures, and, except on the API pages (whose
docstrings write plain-text formulas such as `s_{r-1}` on purpose), a braced sub- or
superscript (`N_{eff}`); and, on the book's pages other than the API, on slips of prose (`prose_slips`: "8..",
") (", a capital after a colon inside a sentence, a missing number printed as 'nan' or 'inf').
On the book's pages other than the API it also fails on glued numbers set wrongly
(`glue_slips`): a hyphen-minus in front of or inside a glued number ("-0.285" where "−0.285"
is meant), and a glued number set in bold outside the author's **...** (myst-nb's default; the
browser compares the number's computed weight with the text around it).  The lecture pages
(intro, chapters, appendices: `is_lecture`) fail above MAX_PAGE_PX (8,000 px) of height at
1280 px.  A full-page screenshot of every page goes to _build/screenshots/, and each page's
height to _build/screenshots/px.json.

    python .ci/check_html.py --tex-only [_build/html]

runs only the TeX, prose and glue checks, on the HTML files as built (no browser needed; a
glued number counts as bold there when the page does not link the book's stylesheet
_static/looped.css, which sets it in the weight of its text).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
MAX_PAGE_PX = 8000    # a lecture page at 1280 px: about six screens
READER_CHECKS = r"""() => {
  const out = [], article = document.querySelector('article') || document.body;
  const width = article.getBoundingClientRect().width;
  article.querySelectorAll('table').forEach((t, i) => {
    const name = ((t.querySelector('caption') || {}).textContent || `table ${i + 1}`).trim().slice(0, 60);
    // the narrowest box around the table (a cell's output area scrolls, so it clips what is wider)
    let box = t.parentElement, room = width;
    for (; box && box !== article; box = box.parentElement)
      if (box.clientWidth > 0) room = Math.min(room, box.clientWidth);
    const wide = Math.max(t.scrollWidth, t.getBoundingClientRect().width);
    if (wide > room + 1)
      out.push(`"${name}" is ${Math.round(wide)} px wide, its box ${Math.round(room)} px`);
    if (t.querySelector('th.blank') && !t.querySelector('th.index_name'))
      out.push(`"${name}": an index column without a name`);
  });
  article.querySelectorAll('p, li').forEach(p => {
    const m = p.textContent.match(/\d\.?\d*e[+-]\d/);
    if (m && !p.closest('pre, code, .cell_input, .cell_output'))
      out.push(`"${m[0]}" in the prose: ${p.textContent.trim().slice(0, 80)}`);
  });
  article.querySelectorAll('span.pasted-text').forEach(s => {
    const own = parseInt(getComputedStyle(s).fontWeight);
    const around = parseInt(getComputedStyle(s.parentElement).fontWeight);
    if (own > around && own >= 600)
      out.push(`glued number "${s.textContent.trim().slice(0, 30)}" in bold (${own}) in text of weight ${around}`);
  });
  return out;
}"""
# TeX that reached the page unrendered.  A `$...$` span follows MyST's rule for inline math (no
# space just inside either dollar), so "$5 and $10" is not one; a TeX command is a backslash and
# letters (or a TeX spacing command such as `\,`); a braced sub/superscript is `_{...}` / `^{...}`.
TEX_PATTERNS = (
    ("a $...$ span", re.compile(r"\$\$[^$]+\$\$|(?<![\\$])\$(?=[^\s$])[^$\n]*?(?<=[^\s\\])\$(?!\d)")),
    ("a TeX command", re.compile(r"\\(?:[A-Za-z]{2,}|[,;:!])")),
    ("a braced sub/superscript", re.compile(r"[_^]\{[^{}\n]{1,40}\}")),
)
# Slips of typed or generated prose (the page's visible text outside code and math): a doubled
# full stop that is not an ellipsis, back-to-back parentheses, a capital after a colon inside a
# sentence (a name such as "Chapter 4" or "FineWeb-Edu" is exempt: its second letter is not lower case
# or it is listed).  Math and code are left out of the visible text, so punctuation next to them
# is not judged.
PROSE_PATTERNS = (
    ("a doubled full stop", re.compile(r"(?<![.\w/])\w+\.\.(?![./\w])")),
    ("back-to-back parentheses", re.compile(r"\) \(")),
    ("a capital after a colon", re.compile(r"(?<=\w): (?!(?:Chapter|Table|Figure|Appendix|Llama|FineWeb|Chinchilla|"
                                           r"Huginn|Ouro|Parcae|Polar|SLURM|Epoch|MuonH|Muon|Adam|AdamW|"
                                           r"Nesterov|I\b|PyPI|Debian|Binder|Hugging|Meta)\b)[A-Z][a-z]+ [a-z]")),
    ("a missing number printed raw", re.compile(r"(?<![\w.\-/])(?:nan|-?inf)(?![\w.\-/])")),   # a table cell, a glue
)
# elements whose text is not prose: code, rendered math (MathML, MathJax), scripts, API signatures
_SKIP_TAGS = {"script", "style", "pre", "code", "kbd", "samp", "tt", "math", "svg", "textarea", "head",
              "template", "noscript", "mjx-container"}
_SKIP_CLASSES = {"math", "MathJax", "MathJax_Preview", "mjx-container", "highlight", "cell_input", "sig",
                 "headerlink", "literal"}
_BLOCK_TAGS = {"p", "div", "li", "td", "th", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "br", "dt", "dd",
               "section", "article", "table", "caption", "figcaption", "blockquote", "ul", "ol", "dl",
               "details", "summary", "aside", "nav", "main", "header", "footer", "hr", "img", "figure",
               "label", "button", "option"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
              "source", "track", "wbr"}


class _VisibleText(HTMLParser):
    """The text a reader sees, one line per block element, without code, math and scripts."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []   # (tag, inside a skipped element)
        self.parts: list[str] = []

    def _skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag, attrs):
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        if tag in _VOID_TAGS:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skip = self._skipping() or tag in _SKIP_TAGS or bool(classes & _SKIP_CLASSES)
        self.stack.append((tag, skip))

    def handle_startendtag(self, tag, attrs):
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        for i in range(len(self.stack) - 1, -1, -1):   # close it and anything left open inside it
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if not self._skipping():
            self.parts.append(data)


def _feedable(html: str) -> str:
    """The page with a stray '<![' (an unescaped '<' in a table cell, such as a regex) escaped:
    Python's HTML parser stops on it."""
    return re.sub(r"<!\[(?!CDATA\[)", "&lt;![", html)


def visible_text(html: str) -> str:
    """The visible text of an HTML page (`_VisibleText`): block elements on lines of their own."""
    parser = _VisibleText()
    parser.feed(_feedable(html))
    parser.close()
    return "".join(parser.parts)


def tex_leaks(html: str, braces: bool = True) -> list[str]:
    """One problem per piece of unrendered TeX in the page's visible text (`TEX_PATTERNS`; without
    the braced sub/superscripts when ``braces`` is false), with the line it sits in; empty when
    every formula was rendered."""
    out = []
    patterns = [p for p in TEX_PATTERNS if braces or not p[0].startswith("a braced")]
    for line in visible_text(html).splitlines():
        line = " ".join(line.split())
        seen = line          # a command inside a $...$ span already reported is not reported again
        for what, rx in patterns:
            for m in rx.finditer(seen):
                start = max(0, m.start() - 40)
                out.append(f"raw TeX, {what} {m.group(0)!r}: ...{line[start:m.end() + 40]}...")
            seen = rx.sub(lambda m: " " * len(m.group(0)), seen)
    return list(dict.fromkeys(out))


def prose_slips(html: str) -> list[str]:
    """One problem per slip of `PROSE_PATTERNS` in the page's visible text, with its context."""
    out = []
    for line in visible_text(html).splitlines():
        line = " ".join(line.split())
        for what, rx in PROSE_PATTERNS:
            for m in rx.finditer(line):
                start = max(0, m.start() - 40)
                out.append(f"prose: {what} {m.group(0)!r}: ...{line[start:m.end() + 40]}...")
    return list(dict.fromkeys(out))


# a hyphen-minus that starts a number (not in a word or a range such as 384-768)
_HYPHEN_NUMBER = re.compile(r"(?<![\w.\-\u2212])-(?=\.?\d)")


class _Glue(HTMLParser):
    """Each glued value (span.pasted-text): its text, the text just before it, and whether it sits
    inside <strong>/<b> (the author's **...**)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool]] = []   # (tag, a glue span, bold)
        self.before = ""
        self.glued: list[dict] = []
        self.stylesheets: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link" and "stylesheet" in (a.get("rel") or ""):
            self.stylesheets.append(a.get("href") or "")
        if tag in _VOID_TAGS:
            return
        if tag in _BLOCK_TAGS:
            self.before = ""
        glue = tag == "span" and "pasted-text" in (a.get("class") or "").split()
        bold = tag in ("strong", "b") or (bool(self.stack) and self.stack[-1][2])
        if glue:
            self.glued.append(dict(text="", before=self.before, bold=bold))
        self.stack.append((tag, glue, bold))

    def handle_endtag(self, tag):
        if tag in _BLOCK_TAGS:
            self.before = ""
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if any(g for _, g, _ in self.stack):
            self.glued[-1]["text"] += data
        self.before = (self.before + data)[-40:]


def glue_slips(html: str) -> list[str]:
    """One problem per glued number set wrongly: a hyphen-minus typed right before it or inside it
    (the book prints U+2212 "−"), or, when the page does not link _static/looped.css (which sets
    a glued number in the weight of its text), a glued number outside <strong>/<b> (myst-nb's
    stylesheet makes it bold)."""
    parser = _Glue()
    parser.feed(_feedable(html))
    parser.close()
    restyled = any(h.split("?")[0].endswith("looped.css") for h in parser.stylesheets)
    out = []
    for g in parser.glued:
        text, before = " ".join(g["text"].split()), g["before"]
        context = "..." + re.sub(r"\s+", " ", before)[-30:] + text + "..."
        if re.search(r"(?<![\w.\-\u2212])-$", before) and text[:1].isdigit():
            out.append(f"glue: a hyphen-minus typed before the glued number {text!r}: {context}")
        if _HYPHEN_NUMBER.search(text):
            out.append(f"glue: a hyphen-minus in the glued number {text!r}: {context}")
        if not restyled and not g["bold"]:
            out.append(f"glue: the glued number {text!r} is bold outside **...** (no looped.css): {context}")
    return list(dict.fromkeys(out))


def is_lecture(page_path: str) -> bool:
    """The pages read as lectures: the intro, the chapters and the appendices."""
    name = Path(page_path).stem
    return page_path.startswith("book/") and (name == "intro" or name.startswith("appendix_")
                                              or re.match(r"\d\d_", name) is not None)


def _is_api(page_path: str) -> bool:
    return page_path.startswith("book/api")


def _is_prose(page_path: str) -> bool:
    """The book's own pages: not the API pages, nor Sphinx's index and search pages."""
    return page_path.startswith("book/") and not _is_api(page_path)


def tex_only(html_dir: Path) -> int:
    """The TeX and prose checks alone, on the built HTML files (no browser)."""
    failures = []
    pages = sorted(p for p in html_dir.rglob("*.html")
                   if not p.relative_to(html_dir).parts[0].startswith(("_", ".")))
    for page in pages:
        name = page.relative_to(html_dir).as_posix()
        html = page.read_text()
        failures += [f"{name}: {p}" for p in tex_leaks(html, braces=not _is_api(name))]
        failures += [f"{name}: {p}" for p in prose_slips(html) + glue_slips(html)] if _is_prose(name) else []
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(f"check_html: {len(failures)} piece(s) of raw TeX or slips of prose or glue in {len(pages)} pages",
              file=sys.stderr)
        return 1
    print(f"check_html: no raw TeX and no slips of prose or glue in {len(pages)} pages")
    return 0


ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage"]


def find_chromium() -> str:
    for cand in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    sys.exit("check_html: no chromium found (apt-get install -y chromium)")


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/favicon.ico" and not (Path(self.directory) / "favicon.ico").exists():
            self.send_response(204)  # browsers ask for it unprompted; the book has none
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only_tex = "--tex-only" in argv
    argv = [a for a in argv if a != "--tex-only"]
    html = Path(argv[0] if argv else ROOT / "_build" / "html").resolve()
    shots = html.parent / "screenshots"
    if not (html / "index.html").exists():
        sys.exit(f"check_html: {html} has no index.html; run `make book` first")
    if only_tex:
        return tex_only(html)
    shots.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                   if not p.relative_to(html).parts[0].startswith(("_", ".")))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"

    from playwright.sync_api import sync_playwright
    failures: list[str] = []
    heights: dict[str, list[int]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
        for page_path in pages:
            page = context.new_page()
            problems: list[str] = []

            def on_request(route, request, problems=problems):
                if urlparse(request.url).hostname in ("127.0.0.1", "localhost") or request.url.startswith("data:"):
                    route.continue_()
                else:
                    problems.append(f"external request {request.url}")
                    route.abort()

            page.route("**/*", on_request)
            page.on(
                "console",
                lambda m, problems=problems: m.type == "error" and problems.append(f"console error: {m.text}"),
            )
            page.on("pageerror", lambda e, problems=problems: problems.append(f"page error: {e}"))
            page.on(
                "requestfailed", lambda r, problems=problems: problems.append(f"request failed: {r.url} ({r.failure})")
            )
            page.on(
                "response",
                lambda r, problems=problems: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"),
            )
            page.goto(base + page_path, wait_until="networkidle")
            page.wait_for_timeout(200)
            if page_path.startswith("book/") and not page_path.startswith("book/api"):
                problems += page.evaluate(READER_CHECKS)
            problems += tex_leaks(page.content(), braces=not _is_api(page_path))
            problems += prose_slips(page.content()) if _is_prose(page_path) else []
            # the weight of glued numbers is judged in the browser (READER_CHECKS), on computed styles
            problems += [p for p in glue_slips(page.content()) if "bold" not in p] if _is_prose(page_path) else []
            if page_path.startswith("book/"):
                page.screenshot(path=str(shots / (Path(page_path).stem + ".png")), full_page=True)
                height = page.evaluate("document.documentElement.scrollHeight")
                heights[Path(page_path).stem] = [1280, height]
                if is_lecture(page_path) and height > MAX_PAGE_PX:
                    problems.append(f"the page is {height:,} px high at 1280 px, above {MAX_PAGE_PX:,}")
            status = "ok" if not problems else f"{len(problems)} problem(s)"
            print(f"[check_html] {page_path}: {status}", flush=True)
            failures += [f"{page_path}: {p}" for p in dict.fromkeys(problems)]
            page.close()
        browser.close()
    server.shutdown()
    (shots / "px.json").write_text(json.dumps(heights) + "\n")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(f"check_html: {len(failures)} problem(s) in {len(pages)} pages", file=sys.stderr)
        return 1
    where = shots.relative_to(ROOT) if shots.is_relative_to(ROOT) else shots
    print(f"check_html: {len(pages)} pages clean; screenshots in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
