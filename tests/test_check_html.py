"""The HTML check's reader-side rules that run without a browser, on small HTML snippets: no raw
TeX on any page (`.ci/check_html.py`'s `tex_leaks`), no slips of prose (`prose_slips`), glued
numbers with a true minus and in the weight of their text (`glue_slips`), and which pages are held
to the lecture height (`is_lecture`)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_html", ROOT / ".ci" / "check_html.py")
check_html = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_html)


def page(body: str) -> str:
    return f"<!DOCTYPE html><html><head><title>$x$ \\alpha</title></head><body><article>{body}</article></body></html>"


@pytest.mark.parametrize("body, found", [
    ("<p>Our $r = 2$ pays 0.065 nats.</p>", "$r = 2$"),
    ("<p>the size term $\\alpha A N_\\mathrm{eff}^{-\\alpha}$ here</p>", "$\\alpha A"),
    ("<li>with <em>$\\varphi$</em> fixed</li>", "$\\varphi$"),
    ("<p>gap: αA N_\\mathrm{eff}</p>", "\\mathrm"),
    ("<p>a thin space 0.1\\,nats</p>", "\\,"),
    ("<td>N_{eff}</td>", "_{eff}"),
    ("<p>$$L = E + A N^{-\\alpha}$$</p>", "$$L = E"),
    ("<ul><li>one<li>and $x$ in an unclosed item</ul>", "$x$"),
    ("<div class='cell_output'><table><tr><th>$\\varphi$</th></tr></table></div>", "$\\varphi$"),
    ("<nav><a href='#'>Is $\\varphi$ a constant?</a></nav>", "$\\varphi$"),
])
def test_unrendered_tex_is_found(body, found):
    leaks = check_html.tex_leaks(page(body))
    assert leaks and any(found in leak for leak in leaks), leaks


@pytest.mark.parametrize("body", [
    "<p>φ = 0.641, r = 2 and N<sub>eff</sub> as Unicode and HTML</p>",
    # rendered math: MathML (this book) or MathJax, with the TeX kept as an annotation
    "<p>with <span class='math notranslate nohighlight'><math><mi>φ</mi><semantics><annotation "
    "encoding='application/x-tex'>\\varphi</annotation></semantics></math></span> fixed</p>",
    "<p><mjx-container class='MathJax'>$r = 2$ \\varphi</mjx-container></p>",
    # code is not prose
    "<p>run <code class='docutils literal'>echo $HOME$ \\n</code> first</p>",
    "<div class='highlight'><pre>x = '$a$' + r'\\mathrm{b}'</pre></div>",
    "<div class='cell_input'><p>$x$</p></div>",
    "<dl><dt class='sig sig-object py'>f(pattern='$[a-z]+$')</dt><dd>plain text</dd></dl>",
    # dollars that are not math (MyST's rule: no space just inside either dollar)
    "<p>it costs $5 and $10, or $5-$10 a day</p>",
    # a span never runs across two block elements
    "<p>one $a</p><p>b$ two</p>",
    "<p>a line<br>$<br/>and another</p><img src='x.png' alt='$x$'>",
    "<script>var s = '$x$ \\\\alpha';</script><style>a::after { content: '\\\\2014' }</style>",
])
def test_rendered_math_code_and_plain_dollars_pass(body):
    assert check_html.tex_leaks(page(body)) == []


def test_the_page_title_is_not_visible_text():
    assert check_html.tex_leaks(page("<p>fine</p>")) == []


def test_tex_only_mode_checks_the_built_files(tmp_path, capsys):
    (tmp_path / "book").mkdir()
    (tmp_path / "_static").mkdir()
    (tmp_path / "index.html").write_text(page("<p>fine</p>"))
    (tmp_path / "_static" / "skipped.html").write_text(page("<p>$x$</p>"))   # theme files are not pages
    (tmp_path / "book" / "ch.html").write_text(page("<p>φ fine</p>"))
    assert check_html.main(["--tex-only", str(tmp_path)]) == 0
    (tmp_path / "book" / "ch.html").write_text(page("<p>Our $r = 2$ pays</p>"))
    assert check_html.main(["--tex-only", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "book/ch.html: raw TeX, a $...$ span '$r = 2$'" in err
    assert "1 piece(s) of raw TeX or slips of prose or glue in 2 pages" in err


def test_api_pages_may_write_plain_text_subscripts(tmp_path):
    doc = page("<dd><p>compares it with e + s_0 + … + s_{i-1} recomputed</p></dd>")
    assert check_html.tex_leaks(doc) and not check_html.tex_leaks(doc, braces=False)
    assert check_html.tex_leaks(page("<p>with $\\varphi$ fixed</p>"), braces=False)   # but no $...$ there either
    (tmp_path / "book").mkdir()
    (tmp_path / "index.html").write_text(page("<p>fine</p>"))
    (tmp_path / "book" / "api_core.html").write_text(doc)
    assert check_html.main(["--tex-only", str(tmp_path)]) == 0


def test_one_report_per_span():
    leaks = check_html.tex_leaks(page("<p>per e-fold of $\\alpha A N_\\mathrm{eff}^{-\\alpha}$, and \\varphi</p>"))
    assert len(leaks) == 2 and "a $...$ span" in leaks[0] and "'\\\\varphi'" in leaks[1], leaks


@pytest.mark.parametrize("body, found", [
    ("<p>i.e. d = 24 to 64 is its s = 3 to 8.. and more</p>", "a doubled full stop"),
    ("<p>it misses joint fit R² (raw nats) (0.9868, aim ≥ 0.99)</p>", "back-to-back parentheses"),
    ("<li>Paired design: Each variant run against its twin</li>", "a capital after a colon"),
    ("<table><tr><td>0.554</td><td>nan</td></tr></table>", "a missing number printed raw"),
])
def test_slips_of_prose_are_found(body, found):
    slips = check_html.prose_slips(page(body))
    assert len(slips) == 1 and found in slips[0], slips


@pytest.mark.parametrize("body", [
    "<p>Wait for it...</p>",                                # an ellipsis
    "<p>see ../shared and v2.0..v2.1 in <code>a) (b</code></p>",
    "<p>the recipe: FineWeb-Edu with Llama-2; see Chapter 4: Is φ a constant?</p>",   # names after a colon
    "<p>two numbers: 0.64 and 0.46 (ours) and (theirs)</p>",
    "<p>in short: A and B are scale coefficients</p>",       # a capital that starts no lower-case word
    "<p>a NaN loss ends the run; see info and nanoGPT</p>",  # the word, not a printed number
])
def test_clean_prose_passes(body):
    assert check_html.prose_slips(page(body)) == []


def test_tex_only_mode_fails_on_a_slip_of_prose_but_not_on_the_api_pages(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "index.html").write_text(page("<p>fine</p>"))
    (tmp_path / "book" / "api_core.html").write_text(page("<dd><p>Returns: The fitted law (a) (b)</p></dd>"))
    assert check_html.main(["--tex-only", str(tmp_path)]) == 0
    (tmp_path / "book" / "ch.html").write_text(page("<p>The verdict: Each arm alone</p>"))
    assert check_html.main(["--tex-only", str(tmp_path)]) == 1


STYLED = '<link rel="stylesheet" type="text/css" href="../_static/looped.css?v=1" />'


def glued(body: str, styled: bool = True) -> str:
    """A page whose glued numbers are set in the body weight (it links looped.css) or not."""
    return page((STYLED if styled else "") + body)


@pytest.mark.parametrize("body, found", [
    ('<p>φ falls by <span class="pasted-text">-0.285</span> per decade</p>',
     "a hyphen-minus in the glued number '-0.285'"),
    ('<p>an interval <span class="pasted-text">[-0.109, +0.102]</span></p>', "a hyphen-minus in the glued number"),
    ('<p>z = -<span class="pasted-text">2.0</span></p>', "a hyphen-minus typed before the glued number '2.0'"),
    ('<p>from (-<span class="pasted-text">0.5</span>)</p>', "typed before"),
])
def test_a_hyphen_minus_at_a_glued_number_is_found(body, found):
    slips = check_html.glue_slips(glued(body))
    assert len(slips) == 1 and found in slips[0], slips


@pytest.mark.parametrize("body", [
    '<p>φ falls by <span class="pasted-text">−0.285</span> per decade</p>',       # a true minus
    '<p>z = −<span class="pasted-text">2.0</span>, a typed true minus</p>',
    '<p>widths <span class="pasted-text">384-768</span> and run <span class="pasted-text">cpu-3</span></p>',
    '<p>a range 2-<span class="pasted-text">4</span> and an item</p><p>-</p><p><span class="pasted-text">5</span></p>',
    '<p>bold where the author wrote it: <strong>φ = <span class="pasted-text">0.641</span></strong></p>',
])
def test_true_minus_ranges_and_the_authors_bold_pass(body):
    assert check_html.glue_slips(glued(body)) == []


def test_a_glued_number_is_bold_without_the_books_stylesheet():
    body = '<p>φ = <span class="pasted-text">0.641</span>, and <b><span class="pasted-text">0.5</span></b></p>'
    slips = check_html.glue_slips(glued(body, styled=False))
    assert len(slips) == 1 and "'0.641' is bold outside **...**" in slips[0], slips
    assert check_html.glue_slips(glued(body)) == []


def test_tex_only_mode_fails_on_a_glue_slip_on_book_pages_only(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "index.html").write_text(page("<p>fine</p>"))
    bad = glued('<p>falls by <span class="pasted-text">-0.285</span></p>')
    (tmp_path / "book" / "api_core.html").write_text(bad)
    assert check_html.main(["--tex-only", str(tmp_path)]) == 0
    (tmp_path / "book" / "03_fit.html").write_text(bad)
    assert check_html.main(["--tex-only", str(tmp_path)]) == 1


@pytest.mark.parametrize("path, lecture", [
    ("book/intro.html", True), ("book/03_fit.html", True), ("book/04_shape.html", True),
    ("book/appendix_design.html", True), ("book/api_core.html", False), ("book/bibliography.html", False),
    ("book/cite.html", False), ("book/glossary.html", False), ("index.html", False),
])
def test_the_page_height_limit_holds_for_lectures(path, lecture):
    assert check_html.is_lecture(path) is lecture
    assert check_html.MAX_PAGE_PX == 8000
