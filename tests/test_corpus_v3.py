"""Corpus v3 on tiny synthetic packages: the markup readers, the Debian index, fetching with a
substitute, the pin by content, the registry check and a deterministic build (no network)."""
import gzip
import hashlib
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from test_corpus import deb_bytes, sentence

from looped.config import PRESETS
from looped.data import corpus as C
from looped.data import dataset as D
from looped.data import markup as M
from looped.data import prose_v3
from looped.data import sources as S

PROSE = "The quick reader follows every sentence of this manual to its very end. It explains why."


# ------------------------------------------------------------------------------ markup

def test_is_prose_keeps_sentences_and_drops_fragments():
    assert M.is_prose(PROSE)
    assert not M.is_prose("--verbose, -v   print more")                      # an option list
    assert not M.is_prose("x = f(a, b); y = g[x] + h(x) * 2; return y;")     # code
    assert not M.is_prose("A heading with ten words but no end at all here")  # no sentence end
    assert M.prose([PROSE, "  " + PROSE, "short."]) == [PROSE]                # collapsed, once


def test_html_blocks_skip_navigation_code_and_tables():
    page = (f"<html><head><title>T</title><script>var x = 1;</script></head><body class='wy-body-for-nav'>"
            f"<nav><p>{PROSE} nav</p></nav><div class='sphinxsidebar'><p>{PROSE} side</p></div>"
            f"<h1>Intro<a class='headerlink'>¶</a></h1><p>{PROSE}<br>Second line &amp; more.</p>"
            f"<pre>for i in x: print(i)</pre><table><tr><td>{PROSE} cell</td></tr></table>"
            f"<div class='highlight-python'><p>code()</p></div><ul><li>{PROSE} item</li></ul></body></html>")
    blocks = M.html_blocks(page)
    assert blocks == ["Intro", PROSE, "Second line & more.", PROSE + " item"]


def test_info_troff_text_and_separated():
    info = (f"\x1f\nFile: x.info,  Node: Intro,  Next: Use\n\nIntro\n*****\n\n{PROSE}\nwrapped.\n\n"
            "     example code here\n     more code\n\n* Menu:\n\n* Use::  how\n")
    assert M.info_nodes(info) == [("Intro", ["Intro", PROSE + " wrapped."])]
    man = ('.\\" comment\n.TH X 1\n.SH NAME\nx \\- do it\n.SH DESCRIPTION\n.B x\nreads '
           '\\fIfiles\\fP \\(em fast.\n.PP\nNext para.\n.nf\ncode line\n.fi\n')
    assert M.troff_paragraphs(man) == ["x - do it", "x reads files — fast.", "Next para."]
    book = ("Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nOne\ntwo.\n\nThree.\n"
            "*** END OF THE PROJECT GUTENBERG")
    assert M.text_paragraphs(book) == ["One two.", "Three."]
    assert M.separated("a b\n-- A\n%\nc d\n%\n", "%") == ["a b\n-- A", "c d"]


def test_dictd_and_json():
    first = b"head one\n  {Defn}: a word [Webster 1913 Suppl.]\n"
    data = first + b"second\n  2. x\n"
    b64 = lambda n: "".join(M._B64[(n >> s) & 63] for s in (12, 6, 0)).lstrip("A") or "A"  # noqa: E731
    n = len(first)
    index = f"00-database-info\tA\tB\nhead\t{b64(0)}\t{b64(n)}\nalias\t{b64(0)}\t{b64(n)}\n".encode()
    entries = M.dictd_entries(index, gzip.compress(data))
    assert [h for h, _ in entries] == ["head"]  # the alias points at the same entry: read once
    assert M.dictd_paragraphs(entries[0][1]) == ["head one {Defn}: a word".replace("{Defn}", "Defn")]
    obj = {"id": "x", "description": "A <color_red>red</color> thing.", "nested": [{"text": {"str": "Hi."}}],
           "name": "ignored"}
    assert M.json_strings(obj) == ["A red thing.", "Hi."]
    assert M.json_documents(b"not json") == []


# ------------------------------------------------------------------------------ sources: index, fetch, pins

def index_text(entries):
    return "\n\n".join(f"Package: {p}\nVersion: {v}\nFilename: {f}\nSHA256: {h}" for p, v, f, h in entries) + "\n"


def html_source(tmp_path, text=PROSE, version="1.0-1", pin_text=True, name="xdoc"):
    deb = deb_bytes({"usr/share/doc/x/html/a.html": f"<p>{text}</p>".encode(),
                     "usr/share/doc/x/html/b.html": f"<p>{sentence(3, 12)}</p>".encode()})
    pool = f"pool/main/x/x-src/x-doc_{version}_all.deb"
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / pool.rsplit("/", 1)[-1]).write_bytes(deb)
    s = S.Source(name, "x-doc", version, hashlib.sha256(deb).hexdigest(), "MIT", pool=pool, kind="manual",
                 reader="html", files=r"html/[^/]+\.html$")
    if pin_text:
        s = replace(s, text_sha256=C.text_digest(C.source_documents(s, tmp_path / s.filename)))
    return s, deb


def test_index_locate_and_registry_problems(tmp_path):
    s, deb = html_source(tmp_path)
    idx = S.parse_index(index_text([("x-doc", s.version, s.pool, s.sha256), ("other", "1", "pool/o.deb", "00")]))
    assert S.locate(s, idx)["Filename"] == s.pool and S.registry_problems([s], idx) == []
    moved = S.parse_index(index_text([("x-doc", "1.0-2", "pool/main/x/x-src/x-doc_1.0-2_all.deb", "ab" * 32)]))
    (p,) = S.registry_problems([s], moved)
    assert p.startswith("xdoc: trixie lists x-doc 1.0-2") and "pinned 1.0-1" in p
    assert S.registry_problems([s], S.parse_index("")) == ["xdoc: x-doc is no longer in Debian trixie"]
    # without a pin by content (v2), only the pinned file itself will do
    assert S.locate(replace(s, text_sha256=""), moved) is None


def test_fetch_takes_a_substitute_and_the_text_pin_decides(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    s, _ = html_source(mirror)                                   # the pinned text
    rebuilt = deb_bytes({"usr/share/doc/x/html/a.html": f"<p>{PROSE}</p>".encode(),   # same text,
                         "usr/share/doc/x/html/b.html": f"<p>{sentence(3, 12)}</p>".encode(),
                         "usr/share/doc/x/changelog": b"rebuilt"})                     # new archive
    new_pool = "pool/main/x/x-src/x-doc_1.0-1+b1_all.deb"
    (mirror / new_pool).parent.mkdir(parents=True)
    (mirror / new_pool).write_bytes(rebuilt)
    idx = S.parse_index(index_text([("x-doc", "1.0-1+b1", new_pool, hashlib.sha256(rebuilt).hexdigest())]))
    monkeypatch.setattr(S, "MIRROR", mirror.as_uri())
    dest = tmp_path / "src"
    S.fetch([s], dest, verbose=False, index=idx)
    assert json.loads((dest / S.SUBSTITUTES).read_text())[s.filename]["version"] == "1.0-1+b1"
    docs = C.documents(dest, sources=[s])                        # accepted: its text matches the pin
    assert [k for k, _ in docs] == ["xdoc/x/html/a.html", "xdoc/x/html/b.html"]
    changed = replace(s, text_sha256="0" * 64)
    with pytest.raises(S.SourceError, match=r"xdoc \(x-doc\): its text changed: digest [0-9a-f]{16}, pinned 0{16}"):
        C.documents(dest, sources=[changed])


def test_missing_sources_name_what_works_instead(tmp_path):
    with pytest.raises(S.SourceError, match=r"corpus v3: sources missing in .*: run `make corpus`$"):
        C.documents(tmp_path, version=3)
    with pytest.raises(S.SourceError) as e:
        C.documents(tmp_path, version=2)
    msg = str(e.value)
    assert "bigbench-1.0.0.tar.gz" in msg and "left PyPI" in msg and "prose3" in msg and "make corpus" in msg


def test_every_v3_source_is_pinned_three_ways():
    srcs = prose_v3.sources()
    assert len(srcs) == len({s.name for s in srcs}) == len(prose_v3.TEXT_SHA256)
    for s in srcs:
        assert s.pool.startswith("pool/main/") and s.pool.endswith("_all.deb") and len(s.sha256) == 64
        assert len(s.text_sha256) == 64 and s.suite == "trixie" and s.kind in prose_v3.KINDS and s.licence


# ------------------------------------------------------------------------------ a deterministic build

def test_prose3_build_is_deterministic_and_named_by_digest(tmp_path, monkeypatch):
    srcs = []
    for i in range(6):
        s, _ = html_source(tmp_path, text=" ".join(sentence(10 * i + k, 12) for k in range(8)), version=f"{i}.0",
                           name=f"x{i}")
        srcs.append(s)
    monkeypatch.setitem(C.VERSIONS, 3, tuple(srcs))
    monkeypatch.setattr(C, "VAL_PERMILLE", 300)
    p = replace(PRESETS["prose3"], vocab_size=300, seq_len=16)
    a = D.prepare(p, tmp_path / "a", source=tmp_path)
    b = D.prepare(p, tmp_path / "b", source=tmp_path)
    assert a.name == "prose3-bpe300-T16"
    ma, mb = (json.loads((d / "meta.json").read_text()) for d in (a, b))
    assert ma["files"] == mb["files"] and ma["digest"] == mb["digest"] == D.files_digest(ma["files"])
    for name in ma["files"]:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert ma["corpus"] == "prose3" and ma["corpus_version"] == 3
    assert D.verify_manifest(mb, a / "meta.json").startswith("identical to the committed manifest")
    ma["files"]["train-000.bin"] = "0" * 64
    ma["digest"] = D.files_digest(ma["files"])
    (a / "meta.json").write_text(json.dumps(ma))
    with pytest.raises(D.DataError, match="differs from the committed manifest.*train-000.bin"):
        D.verify_manifest(mb, a / "meta.json")


def test_check_sources_cli_reports_a_gone_source(monkeypatch, capsys):
    s = prose_v3.sources()[0]
    monkeypatch.setattr(C, "packages_index", lambda suite: S.parse_index(index_text([])))
    assert C.main(["check-sources"]) == 1
    err = capsys.readouterr().err
    assert f"corpus v3 source gone: {s.name}: {s.package} is no longer in Debian trixie" in err


def test_corpus_cli_without_sources_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "looped.data.dataset", "prepare", "--preset", "prose3",
                        "--data-dir", str(tmp_path / "d"), "--source", str(tmp_path / "none")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "run `make corpus`" in r.stderr


def test_no_run_of_the_v3_studies_repeats_data():
    """The committed manifest's training split outlasts the longest planned run of every prose3 study."""
    from looped.studies.sweep.study import data_margin
    m = data_margin("prose3")
    assert m["studies"] == 9 and m["train_tokens"] >= 25_000_000 and m["margin"] > 1.5


def test_readme_composition_table_is_the_committed_csv():
    import csv

    from looped.config import REPO
    readme = (REPO / "README.md").read_text()
    rows = list(csv.DictReader(open(REPO / "runs" / "prose3-composition.csv")))
    assert len(rows) == len(prose_v3.sources())
    for r in rows:
        assert (f"| {r['source']} | `{r['package']}` {r['version']} | {r['kind']} | {int(r['words']) / 1e6:.2f}M | "
                f"{int(r['tokens']) / 1e6:.2f}M | {100 * float(r['token_share']):.1f}% |") in readme, r["source"]
    assert max(float(r["token_share"]) for r in rows) < 0.25  # no source above a quarter of the tokens


def test_a_source_gone_from_debian_says_what_works_instead(tmp_path):
    s, _ = html_source(tmp_path / "mirror")
    with pytest.raises(S.SourceError) as e:
        S.fetch([s], tmp_path / "src", verbose=False, index=S.parse_index(""))
    msg = str(e.value)
    assert "no longer in Debian trixie" in msg and s.filename in msg and "pinned digest" in msg and "\n" not in msg
