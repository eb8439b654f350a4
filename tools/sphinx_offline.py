"""Keeps the built book self-contained: MathML math, and no duplicate or unused thebe scripts.

Math: a tiny Sphinx math renderer, LaTeX -> MathML with docutils' own converter.

MathJax would be fetched from a CDN when a page is opened; MathML is rendered natively by the
browser, so the book needs no network at build or view time.  Only the LaTeX subset that
docutils understands is available (fractions, sub/superscripts, Greek, \\mathrm, \\left/\\right,
\\text, aligned environments are not supported: write one equation per block).
"""
from docutils import nodes
from docutils.utils.math import latex2mathml
from sphinx.util.math import get_node_equation_number


def _mathml(tex: str, block: bool) -> str:
    return latex2mathml.tex2mathml(tex.strip(), as_block=block)


def visit_math(self, node):
    self.body.append(self.starttag(node, "span", "", CLASS="math notranslate"))
    self.body.append(_mathml(node.astext(), False) + "</span>")
    raise nodes.SkipNode


def visit_displaymath(self, node):
    self.body.append(self.starttag(node, "div", CLASS="math notranslate",
                                   style="display:flex; justify-content:center; align-items:center;"
                                         " gap:2em; margin:0.8em 0; font-size:1.1em"))
    self.body.append(_mathml(node.astext(), True))
    if node.get("number"):   # "(3.1)" in a chapter, "(A.1)" in an appendix (tools/sphinx_numbering.py)
        self.body.append(f'<span class="eqno">({get_node_equation_number(self, node)})</span>')
    self.body.append("</div>")
    raise nodes.SkipNode


def prune_scripts(app, pagename, templatename, context, doctree):
    """Drop thebe's scripts (live code is off; its inline config block was emitted twice, a
    page error) and any exact duplicate script entry."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        name = getattr(js, "filename", js) or ""
        body = (getattr(js, "attributes", None) or {}).get("body", "")
        if "thebe" in str(name).lower() or "THEBE_JS_URL" in body:
            continue
        if (str(name), body) in seen:
            continue
        seen.add((str(name), body))
        kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_displaymath, None))
    app.connect("html-page-context", prune_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
