"""Markup to running prose: the readers of corpus v3's formats (HTML and Mallard XML, Texinfo's
info files, troff man pages, dictd dictionaries, fortune files, JSON game text, plain text).

Every reader returns a document's paragraphs as plain text, with code blocks, tables and
navigation dropped; `prose` then keeps only paragraphs that read as sentences, which is what a
manual, a dictionary or a game's data holds beside its prose.  Standard library only.
"""
from __future__ import annotations

import gzip
import html
import json
import re
from html.parser import HTMLParser

# ----------------------------------------------------------------------------------------------
# What counts as prose

_WORD = re.compile(r"^[\"'“‘(\[]*[A-Za-z]+(?:['’-][A-Za-z]+)*[.,;:!?\"'”’)\]]*$")
_SENTENCE_END = re.compile(r"[a-z0-9)\"'”’][.!?][\"'”’)]*(?:\s|$)")


def is_prose(paragraph: str, min_words: int = 10, word_share: float = 0.8) -> bool:
    """At least `min_words` words, `word_share` of them plain words (letters, an apostrophe or
    hyphen inside, punctuation around), and a sentence end: a manual's option list, a table row
    or a code fragment fails, a paragraph of explanation passes."""
    words = paragraph.split()
    if len(words) < min_words:
        return False
    return sum(bool(_WORD.match(w)) for w in words) >= word_share * len(words) and bool(_SENTENCE_END.search(paragraph))


def prose(paragraphs, min_words: int = 10) -> list[str]:
    """The prose paragraphs, whitespace collapsed, each once (a page's repeated boilerplate)."""
    out, seen = [], set()
    for p in paragraphs:
        p = " ".join(p.split())
        if p not in seen and is_prose(p, min_words):
            seen.add(p)
            out.append(p)
    return out


# ----------------------------------------------------------------------------------------------
# HTML (and Mallard / DocBook XML, which parse the same way)

_BLOCK = {"p", "div", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "section",
          "article", "td", "th", "tr", "table", "ul", "ol", "dl", "br", "hr", "title", "caption",
          "figure", "figcaption", "note", "item", "list", "terms", "tree", "synopsis", "info", "desc",
          "page", "body", "main", "aside", "header", "footer", "center"}
_SKIP = {"script", "style", "head", "nav", "pre", "screen", "code-block", "listing", "programlisting",
         "table", "svg", "math", "form", "select", "button", "noscript", "iframe", "object", "template"}
# class, id or role tokens of navigation, headings' permalinks, code and boilerplate containers
_SKIP_TOKEN = re.compile(r"(?:wy-)?(?:nav|navigation|navbar|nav-side|nav-top|nav-panel|navheader|navfooter|"
                         r"menu|sidebar|sphinxsidebar(?:wrapper)?|related|breadcrumbs?|headerlink|toc|"
                         r"toctree-wrapper|contents|footer|header|search|highlight(?:-[\w-]+)?|doctest|"
                         r"literal-block|programlisting|screen|signature|sig|copyright|genindex|"
                         r"rst-footer-buttons|example|verbatim)")
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "param", "source",
         "track", "wbr"}


class _Blocks(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, skipping because of this element)
        self.skip, self.cur, self.blocks = 0, [], []

    def flush(self):
        if self.cur:
            self.blocks.append("".join(self.cur))
            self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in _BLOCK:
            self.flush()
        if tag in _VOID:
            return
        tokens = " ".join(v or "" for k, v in attrs if k in ("class", "id", "role")).split()
        style = "".join(v or "" for k, v in attrs if k == "style").replace(" ", "")
        skipping = tag in _SKIP or any(_SKIP_TOKEN.fullmatch(t) for t in tokens) or "display:none" in style
        self.stack.append((tag, skipping))
        self.skip += skipping

    def handle_startendtag(self, tag, attrs):
        if tag in _BLOCK:
            self.flush()

    def handle_endtag(self, tag):
        if tag in _BLOCK:
            self.flush()
        if not any(t == tag for t, _ in self.stack):
            return  # a stray end tag
        while self.stack:
            t, skipping = self.stack.pop()
            self.skip -= skipping
            if t == tag:
                break

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)


def html_blocks(text: str) -> list[str]:
    """The text blocks of an HTML or XML page (paragraphs, list items, headings), without
    scripts, styles, navigation, code listings and tables."""
    p = _Blocks()
    p.feed(text)
    p.close()
    p.flush()
    return [b for b in (" ".join(x.split()) for x in p.blocks) if b]


# ----------------------------------------------------------------------------------------------
# Texinfo info files, troff man pages, plain text

def info_nodes(text: str) -> list[tuple[str, list[str]]]:
    """[(node name, paragraphs)] of an info file: nodes split at the 0x1f separator; menus,
    the node header and examples (indented five spaces or more) dropped."""
    out = []
    for node in text.split("\x1f"):
        m = re.search(r"Node: ([^,\n]+)", node[:300])
        if not m:
            continue
        body = node.split("\n", 2)[-1].split("* Menu:")[0]
        paras = []
        for block in re.split(r"\n\s*\n", body):
            lines = block.split("\n")
            if all(len(x) - len(x.lstrip()) >= 5 for x in lines if x.strip()):
                continue  # an example
            if re.fullmatch(r"[\s*=\-.]+", lines[-1] or "-"):  # a heading underline
                lines = lines[:-1]
            paras.append(" ".join(x.strip() for x in lines if x.strip()))
        out.append((m.group(1).strip(), paras))
    return out


_TROFF_ESC = [(re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)"), ""), (re.compile(r"\\\(em|\\\[em\]"), "—"),
              (re.compile(r"\\\(en|\\\[en\]"), "–"), (re.compile(r"\\\((?:lq|rq|dq)"), '"'),
              (re.compile(r"\\\((?:oq|cq|aq)"), "'"), (re.compile(r"\\[-(]"), "-"),
              (re.compile(r"\\[&|^%:]|\\s[-+]?\d"), ""), (re.compile(r"\\e"), "\\"), (re.compile(r"\\ "), " "),
              (re.compile(r"\\\*\((?:lq|rq)|\\\*\[[^\]]*\]|\\\*."), '"'), (re.compile(r"\\\(.."), "")]


def troff_paragraphs(text: str) -> list[str]:
    """The paragraphs of a man page: macros other than font macros end a paragraph, .nf/.EX
    blocks (code) and comments are dropped, escapes resolved."""
    paras, cur, literal = [], [], False

    def flush():
        if cur:
            paras.append(" ".join(cur))
            cur.clear()

    for line in text.split("\n"):
        if line.startswith((".\\\"", "'\\\"", '\\"')):
            continue
        if line.startswith((".nf", ".EX")):
            flush()
            literal = True
            continue
        if line.startswith((".fi", ".EE")):
            literal = False
            continue
        if literal:
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.'](B|I|R|BI|BR|IB|IR|RB|RI|SM|SB)\s+(.*)", line)
            if m:
                line = re.sub(r'"', "", m.group(2))
            else:
                flush()
                continue
        for pat, rep in _TROFF_ESC:
            line = pat.sub(lambda m, r=rep: r, line)
        if line.strip():
            cur.append(line.strip())
        else:
            flush()
    flush()
    return paras


def text_paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs of plain text, lines joined; a Project Gutenberg header
    and licence footer are cut off."""
    start = re.search(r"\*\*\* ?START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*\n", text)
    end = re.search(r"\*\*\* ?END OF (?:THE|THIS) PROJECT GUTENBERG", text)
    text = text[start.end() if start else 0:end.start() if end else len(text)]
    return [" ".join(b.split()) for b in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if b.strip()]


# ----------------------------------------------------------------------------------------------
# dictd dictionaries, fortune and crawl files, JSON game text

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s: str) -> int:
    n = 0
    for ch in s:
        n = n * 64 + _B64.index(ch)
    return n


def dictd_entries(index: bytes, dict_dz: bytes) -> list[tuple[str, str]]:
    """[(headword, definition text)] of a dictd dictionary in index order, each definition once
    (several headwords can point at one entry); the ``00-database-...`` header entries skipped."""
    data = gzip.decompress(dict_dz)  # dictzip is gzip with a random-access table in a header field
    out, seen = [], set()
    for line in index.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        off, size = _b64num(parts[1]), _b64num(parts[2])
        if (off, size) in seen:
            continue
        seen.add((off, size))
        out.append((parts[0], data[off:off + size].decode("utf-8", "replace")))
    return out


_DICT_MARKUP = [(re.compile(r"\{([^{}]*)\}"), r"\1"),
                (re.compile(r"\[(?:Webster|1913|PJC|WordNet|Obs|Colloq)[^\]]*\]"), ""),
                (re.compile(r"<[^>]{1,20}>"), "")]


def dictd_paragraphs(entry: str) -> list[str]:
    """An entry's senses as paragraphs: blank-line (or indent-change) separated blocks with
    cross-reference braces and source tags removed."""
    for pat, rep in _DICT_MARKUP:
        entry = pat.sub(rep, entry)
    blocks = re.split(r"\n\s*\n|\n(?=\s{0,4}\d+\. )", entry)
    return [" ".join(b.split()) for b in blocks if b.strip()]


def separated(text: str, sep: str) -> list[str]:
    """Records of a fortune (`%`) or crawl (`%%%%`) file, as they are (a fortune's attribution
    line stays with its quotation; a crawl record is a name, a blank line and its text)."""
    return [r.strip("\n") for r in re.split(rf"(?m)^{re.escape(sep)}\s*$", text) if r.strip()]


_JSON_KEYS = {"description", "text", "snippets", "dialogue", "message", "messages", "info", "desc",
              "lore", "story", "responses", "death_msg", "use_action"}
_TAGS = re.compile(r"</?(?:color|good|bad|info|bold|em|npc_name|u_name|stat|help)[^>]*>|<[a-z_]+>")


def json_strings(obj, key: str | None = None) -> list[str]:
    """The strings under descriptive keys (description, text, dialogue, snippets...) of a JSON
    value, in document order, colour and name tags removed."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_strings(v, k if k in _JSON_KEYS else (key if k == "str" else None))
    elif isinstance(obj, list):
        for v in obj:
            out += json_strings(v, key)
    elif isinstance(obj, str) and key is not None:
        out.append(html.unescape(_TAGS.sub("", obj)))
    return out


def json_documents(raw: bytes) -> list[str]:
    """The descriptive strings of one JSON (or gzipped JSON) file; [] if it does not parse."""
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json_strings(json.loads(raw.decode("utf-8")))
    except (ValueError, OSError, EOFError):
        return []


__all__ = ["is_prose", "prose", "html_blocks", "info_nodes", "troff_paragraphs", "text_paragraphs",
           "dictd_entries", "dictd_paragraphs", "separated", "json_strings", "json_documents"]
