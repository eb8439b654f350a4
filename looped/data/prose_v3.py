"""Corpus v3: the prose corpus rebuilt from durable sources only (Debian trixie main, packages
that get no security updates), so anyone can rebuild it for years.

v2 took half its words from PyPI's `bigbench` 1.0.0, which has since left PyPI; v3 replaces it
by text that Debian keeps: scripture and commentary, Austen, dictionaries (GCIDE capped to its
longer senses, FOLDOC, the Devil's Dictionary, the Jargon File), two Gutenberg books that ship as
test data, game lore (Cataclysm: DDA, Dungeon Crawl), fortunes, and 21 technical manuals.  Each
source is pinned twice: by the archive (trixie's `Filename:` and `SHA256:`) for the download, and
by the text it yields (`text_sha256`), so a Debian revision that only repackages is accepted and
a changed text is refused (`looped.data.corpus`).

A source's `files` is a regular expression on paths inside the .deb and `reader` says how they
become documents (`read_source`): one document per HTML page, man page, info node, JSON file or
fortune file; dictionary entries grouped by their headword's first two letters.
"""
from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path

from . import markup
from .containers import deb_files
from .sources import Source

KINDS = ("scripture and commentary", "fiction and classics", "dictionaries", "technical manuals",
         "game lore", "quotations and humour")


def _src(name, package, version, pool, licence, kind, reader, files="", min_words=10):
    return Source(name, package, version, ARCHIVE_SHA256[name], licence, pool=pool, kind=kind, reader=reader,
                  files=files, min_words=min_words, text_sha256=TEXT_SHA256[name])


# The pins by archive: trixie's `SHA256:` of each pinned file (its `Filename:` is `pool` below).
ARCHIVE_SHA256 = {
    "web": "b2029a802c44f1d6103de45e9ef5c64a9bd66466776e593e386b5ea84bfc110f",
    "kjv": "abaed17486a0e3d2895a932c9cd7fff2a3a2bd5dc84d37518aa272b2afbfa433",
    "tdavid": "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f",
    "mhcc": "7d2c2a4b4914b63e86f20955c50e71ee850a2ae8c5e991c5e11d295288846864",
    "scofield": "47f06a97e8e754432b92cebf47f34fab36a63b3de51d9551a8adc21eabe64717",
    "austen": "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    "opticks": "998bd3954a021ab2f74b189bb1cdfc3bf7c6eedc5e417a89dda9eaa643d3d859",
    "holmes": "803044ffaba3fb493a6b79f75ceea2e3692e893ef1db5d19fbee2375b875bf42",
    "gcide": "7d6c11be209ca67fb4425b1e4d600e9dc9c5c67d919482e51b99b0cca179601b",
    "foldoc": "136ba51701058a645d9d96a268b4f5646335555649c04b68ac4a17324a54afd3",
    "devil": "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
    "jargon": "17d05997e30eb3d5d6713929b8e2f81b63a5f50073858ad2a06701c71f54dcdb",
    "fortunes": "04be8b7331d90a23ade12a6d377ae505b66399404d8a6b7403d596829c386f4f",
    "cataclysm": "6b225d32b22197e1cf7449aea22027664fca63dccbfbcbcf1af4e3e03a4f2a1c",
    "crawl": "50c8f0091ba88538dde6585e5eddba02677bfe94d3ee4dc90a5bd3a788650f59",
    "manpages": "91b7df0b4bd4e1a3b8ba5b229abd844e03f4c82c45ccb8c964a035190c29a501",
    "manpages-dev": "9de42b48394935236a31385e4bae816911cd20dc3f20250531964aec44082f63",
    "lilypond": "0e14bd74defdf647b99f6f63ae73f35ccc4253624567a6377a4b833c315a8de8",
    "gimp": "b18e0b0763de45eb66a65305c443cf2a03572ec42fc01d6bb2817c5b33e600bf",
    "ada": "5ac90de19344db1e69abe26136ca573b9571a358e395a5a143ba4ebad7745409",
    "handbook": "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa",
    "debian-reference": "81d62f642c571dd5ad2de4aa56ba953c488fc9a0aaf0336dc4ef120ff9e367ce",
    "debian-policy": "942fe167dc16d7f623e5c996332fa50f8b49b8a9970fc219d9ef5775772d0dd1",
    "developers-reference": "fec366e4b20ea0a74e9990340047c5d5e71d51aa2884ce62e17e59e7ad728015",
    "gnome-help": "94202c324aa65e87820ed0cec8872c1bbe81cfd6f238b8d62ce55a79d8cb6b82",
    "gap": "e549e7e196daf7ad6277f9108987a9a21631b9f2cab971f856f0a97c746af389",
    "swi-prolog": "23a24d96b3eacaa6f34bc43db3dd5acc7be2036fe2a32134fc55d45d7073e122",
    "octave": "d0eb111f357825b4500f09449fa51c4e1b648be4376edf89c44e5aafc75a71e7",
    "sklearn": "c213257d8f2afe711f3fdbe6b68560ea4587db580889de4cd1da0be5c1b1d071",
    "grass": "99d5d9b2e7c3e9c4bc723bfe11615da1cb3777d4f00ff1e2481d7b1f7b25cbfb",
    "sqlalchemy": "715be7ca412315bb53375697152eec4a41830b11a16369bd1894bb048795057a",
    "r-manuals": "234e6801ee3ac1a30b38292856f8742339af01c94c904d86a4a1b37db57eb2a3",
    "zsh": "374a3de4bd17fb40216e7bdab324f3e603802235e276a02febef59a8ab2ea543",
    "ghc": "0d56601b5c773022caf895cb45cdd14bf8982884b7a6e0895c4caa8993d78993",
    "maxima": "f495fdefd2a849c074d563a7c81dbcaba1ac317ff50423661a462666ffff1e46",
    "sympy": "382d10f34621c834eaf493a84eb801d8496a19efdac3d1282806824ac046a857",
}

# The pins by content: sha256 of each source's documents as `read_source` (or the SWORD and R
# readers) yields them (`looped.data.corpus.text_digest`).  A reader change that alters them is a
# new corpus version.
TEXT_SHA256 = {
    "web": "957af9ba0240416d38754a3a49c87bdaeaaf8b8623b7116ff25ad9cd52095c3b",
    "kjv": "2c13318a025d0c4c813c166a1f378bbd6802e90701121fc7bc7d03b246cd9708",
    "tdavid": "43296ea041e123e3257a959f014bb6a9d0335ee3a26f0af2240d134df12faa8f",
    "mhcc": "e9677f6acc4072bbbd7c4d93da3ec6a903eb5ee8479d1bcbcb2d3d06e6f63236",
    "scofield": "2fff2246aa571e62eb84f38dc437075fb9c60fe6f325f1246f90304d89b569e2",
    "austen": "c5c523b74c5e8c3b8f3831645ea53202973bfca6ab7695aea6ed9a4f3917b825",
    "opticks": "f2276935965df7de875b26b7aaf8b49641cb5cb1b984267fe7bc7f630cd6855e",
    "holmes": "57ed84c432c27a87e4e83f2b3fe9ead340b78a13699500d68b96ff91801e4709",
    "gcide": "ccc0f2c03943f7a1ddb1e397ae651fa5a3cf0ef795900dda44a9aeecc6e1fb31",
    "foldoc": "2d555d02bb7385ce85565cac935c56043b50ea463da4200121adb4d72e8443fe",
    "devil": "ad15ffa614e919bf674ae42b87ae4907248e77bed071ffafcce0086e68c9e592",
    "jargon": "85c6e5e6c2e9b3c357e4621e8b2354c3da8defb1946fbb7b418ffbdc346814a2",
    "fortunes": "f469c2820a32b6eb582dea255e753851709f1544a5af11f39bcff0d8c94d6424",
    "cataclysm": "ea9aee97c0bbfc84b9c3e772d12c92be10e9193b2550dc616d273c1346b46389",
    "crawl": "74a5e377b133fee7fe208d3ed407beff4d5524f116e43a06673b1f54ce2c0be8",
    "manpages": "81d6f7564d9f46935cc44458171cc8778a8ae2d2f27380998d6a882631deb7cf",
    "manpages-dev": "c2b1ab67697e74ff92d153f974be5abd22728110d0c566df944d53e87b97ce63",
    "lilypond": "5185eda44d7f3794c1940f28ac630edb23999d8e99c7d15c7fefd71adc36b446",
    "gimp": "e1603c7b0b249802e163fad1cdb6a7bf456f31ab5c08e2dd032410315fe80c57",
    "ada": "d8b5efcc5b055b90490c363e6e7e28c55c6a9ecc9ce0ed6c66fc162803326f0b",
    "handbook": "c016913149fc6365aac720e8b696132c46fc84458f9aed4672a29dbe98bcfd58",
    "debian-reference": "3a77ac7e3458800c5e0a34134cc64dcd9cb48615d062696f802ee5e2e07c79c4",
    "debian-policy": "285576a7f739e458876329003f9e1d5cd833ca14f7291980e52139052ad4e5d1",
    "developers-reference": "29570e7cc5a9e5f93ea5269371951940a86c74d85fe2d4ed77c8226eb5439bbf",
    "gnome-help": "d2701f3759f66540eda91843d165d581d23c98486c3d1b7e80cfe2a363cde128",
    "gap": "512ffd490972295c0ecca4be0630d2cbc94bdb748a3cb963269fb4cd652bee05",
    "swi-prolog": "924cde879560771b9fb0220a3e8d72cb97af2478c12f3f99485e8b0530912fb5",
    "octave": "d9b18e0fb75a45f73edbf565cb0f2715af672d31b69749b7c0e6ad7612604200",
    "sklearn": "ddc94c48f483011d2d9c8ec46a922c9b54997e63c7d974ddc59d62948aa82fa9",
    "grass": "1438d32871633d08d8cece9c597eb285509219ffd227f4ba026d77c4f8abcf23",
    "sqlalchemy": "55be50536c3edc297273c2a9ae8aaa385e947ad5c230e2ae99e14220e6edcf88",
    "r-manuals": "f288d169ff25d03e21421472bfac370d455c2cba66addc21af2f0c40e13f5649",
    "zsh": "44c25123fdb92a9f4352af593b4e8191119eb0174c35c51e64453459b7ea9df9",
    "ghc": "b846424bd6b6a23bd8b5d96fc68376d9debeb5d546031de72fb863f88998b666",
    "maxima": "5b715c83a956b9f9cbb878f7a503cd50f1b8da93782983ceb94f49be008a8a9b",
    "sympy": "95099724d1c94e3afdcf5820dca7f658e43d8ddb3d55a42a45940ab49d022be3",
}


def sources():
    """The pinned sources of corpus v3, in build order (cross-source dedup keeps first copies)."""
    return (
        _src("web", "sword-text-web", "522.0-1", "pool/main/s/sword-text-web/sword-text-web_522.0-1_all.deb",
             "public domain", KINDS[0], "sword"),
        _src("kjv", "sword-text-kjv", "22.29-1", "pool/main/s/sword-text-kjv/sword-text-kjv_22.29-1_all.deb",
             "public domain", KINDS[0], "sword"),
        _src("tdavid", "sword-comm-tdavid", "2.1-1", "pool/main/s/sword-comm-tdavid/sword-comm-tdavid_2.1-1_all.deb",
             "public domain", KINDS[0], "sword"),
        _src("mhcc", "sword-comm-mhcc", "2.0-2", "pool/main/s/sword-comm-mhcc/sword-comm-mhcc_2.0-2_all.deb",
             "public domain", KINDS[0], "sword"),
        _src("scofield", "sword-comm-scofield", "2.1-2",
             "pool/main/s/sword-comm-scofield/sword-comm-scofield_2.1-2_all.deb", "public domain", KINDS[0], "sword"),
        _src("austen", "r-cran-janeaustenr", "1.0.0-1",
             "pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb", "novels public domain; package MIT",
             KINDS[1], "austen"),
        _src("opticks", "golang-github-andybalholm-brotli-dev", "1.1.1-1",
             "pool/main/g/golang-github-andybalholm-brotli/golang-github-andybalholm-brotli-dev_1.1.1-1_all.deb",
             "text public domain; package Expat", KINDS[1], "text", r"testdata/Isaac\.Newton-Opticks\.txt$"),
        _src("holmes", "golang-github-bkaradzic-go-lz4-dev", "1.0.0-5",
             "pool/main/g/golang-github-bkaradzic-go-lz4/golang-github-bkaradzic-go-lz4-dev_1.0.0-5_all.deb",
             "text public domain; package BSD-2", KINDS[1], "text", r"go-lz4/testdata/pg1661\.txt$"),
        _src("gcide", "dict-gcide", "0.48.5+nmu4", "pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu4_all.deb", "GPL-2+",
             KINDS[2], "dictd", r"dictd/gcide\.", min_words=30),
        _src("foldoc", "dict-foldoc", "20250211-1", "pool/main/d/dict-foldoc/dict-foldoc_20250211-1_all.deb",
             "GFDL-1.1+, no invariant sections", KINDS[2], "dictd", r"dictd/foldoc\."),
        _src("devil", "dict-devil", "1.0-13.1", "pool/main/d/dict-devil/dict-devil_1.0-13.1_all.deb", "public domain",
             KINDS[2], "dictd", r"dictd/devil\."),
        _src("jargon", "jargon-text", "4.4.7-4.1", "pool/main/j/jargon-text/jargon-text_4.4.7-4.1_all.deb",
             "public domain", KINDS[2], "text", r"jargon\.txt\.gz$"),
        _src("fortunes", "fortunes", "1:1.99.1-9", "pool/main/f/fortune-mod/fortunes_1.99.1-9_all.deb",
             "BSD-4-clause package; quotations of mixed origin", KINDS[5], "fortune", r"games/fortunes/[a-z-]+$"),
        _src("cataclysm", "cataclysm-dda-data", "0.H-1", "pool/main/c/cataclysm-dda/cataclysm-dda-data_0.H-1_all.deb",
             "CC-BY-SA-3.0", KINDS[4], "json", r"games/cataclysm-dda/.*\.json(\.gz)?$"),
        _src("crawl", "crawl-common", "2:0.28.0-1.1", "pool/main/c/crawl/crawl-common_0.28.0-1.1_all.deb", "GPL-2+",
             KINDS[4], "crawl", r"crawl/dat/descript/[a-z_]+\.txt$"),
        _src("manpages", "manpages", "6.9.1-1", "pool/main/m/manpages/manpages_6.9.1-1_all.deb",
             "man-pages copyleft and GPL-2+", KINDS[3], "troff", r"share/man/man\d/.*\.gz$"),
        _src("manpages-dev", "manpages-dev", "6.9.1-1", "pool/main/m/manpages/manpages-dev_6.9.1-1_all.deb",
             "man-pages copyleft and GPL-2+", KINDS[3], "troff", r"share/man/man\d/.*\.gz$"),
        _src("lilypond", "lilypond-doc", "2.24.4-5", "pool/main/l/lilypond/lilypond-doc_2.24.4-5_all.deb", "GFDL-1.3+",
             KINDS[3], "info", r"info/lilypond-(?!internals|snippets)[a-z-]+\.info(-\d+)?\.gz$"),
        _src("gimp", "gimp-help-en", "3.0.0-4", "pool/main/g/gimp-help/gimp-help-en_3.0.0-4_all.deb",
             "GFDL-1.2+, no invariant sections", KINDS[3], "html", r"help/en/[^/]+\.html$"),
        _src("ada", "ada-reference-manual-2012", "1:2020.1commit85143dcb-5",
             "pool/main/a/ada-reference-manual/ada-reference-manual-2012_2020.1commit85143dcb-5_all.deb",
             "Ada RM licence (copy and modify with alterations marked)", KINDS[3], "html",
             r"/arm2012\.html/[^/]+\.html$"),
        _src("handbook", "debian-handbook", "11.20220922",
             "pool/main/d/debian-handbook/debian-handbook_11.20220922_all.deb", "GPL-2+ or CC-BY-SA-3.0", KINDS[3],
             "html", r"html/en-US/[^/]+\.html$"),
        _src("debian-reference", "debian-reference-en", "2.127",
             "pool/main/d/debian-reference/debian-reference-en_2.127_all.deb", "GPL-2+", KINDS[3], "html",
             r"docs/[^/]+\.en\.html$"),
        _src("debian-policy", "debian-policy", "4.7.2.0", "pool/main/d/debian-policy/debian-policy_4.7.2.0_all.deb",
             "GPL-2+", KINDS[3], "html", r"policy\.html/[^/_]+\.html$"),
        _src("developers-reference", "developers-reference", "13.20",
             "pool/main/d/developers-reference/developers-reference_13.20_all.deb", "GPL-2", KINDS[3], "html",
             r"developers-reference/[^/_]+\.html$"),
        _src("gnome-help", "gnome-user-docs", "48.2-1", "pool/main/g/gnome-user-docs/gnome-user-docs_48.2-1_all.deb",
             "CC-BY-SA-3.0", KINDS[3], "html", r"help/C/gnome-help/[^/]+\.page$"),
        _src("gap", "gap-doc", "4.14.0-3", "pool/main/g/gap/gap-doc_4.14.0-3_all.deb", "GPL-2+", KINDS[3], "html",
             r"gap/doc/(ref|tut|hpc)/[^/]+\.html$"),
        _src("swi-prolog", "swi-prolog-doc", "9.2.9+dfsg-1",
             "pool/main/s/swi-prolog/swi-prolog-doc_9.2.9+dfsg-1_all.deb", "GPL-2+ and BSD-2", KINDS[3], "html",
             r"swi-prolog/doc/(Manual|packages)/[^/]+\.html$"),
        _src("octave", "octave-doc", "9.4.0-1", "pool/main/o/octave/octave-doc_9.4.0-1_all.deb", "GPL-3+", KINDS[3],
             "html", r"octave\.html/[^/]+\.html$"),
        _src("sklearn", "python-sklearn-doc", "1.4.2+dfsg-8",
             "pool/main/s/scikit-learn/python-sklearn-doc_1.4.2+dfsg-8_all.deb", "BSD-3-clause", KINDS[3], "html",
             r"python-sklearn-doc/html/(?!_)(?:[^/]+/)*[^/]+\.html$"),
        _src("grass", "grass-doc", "8.4.1-1", "pool/main/g/grass/grass-doc_8.4.1-1_all.deb", "GPL-2+", KINDS[3], "html",
             r"grass-doc/html/[^/]+\.html$"),
        _src("sqlalchemy", "python-sqlalchemy-doc", "2.0.40+ds1-1",
             "pool/main/s/sqlalchemy/python-sqlalchemy-doc_2.0.40+ds1-1_all.deb", "MIT", KINDS[3], "html",
             r"python-sqlalchemy-doc/html/(?!_|changelog)(?:[^/]+/)*[^/]+\.html$"),
        _src("r-manuals", "r-doc-html", "4.5.0-3", "pool/main/r/r-base/r-doc-html_4.5.0-3_all.deb", "GPL-2+", KINDS[3],
             "html", r"R/doc/manual/[^/]+\.html$"),
        _src("zsh", "zsh-doc", "5.9-8", "pool/main/z/zsh/zsh-doc_5.9-8_all.deb", "Zsh (permissive)", KINDS[3], "html",
             r"zsh-common/html/[^/]+\.html$"),
        _src("ghc", "ghc-doc", "9.6.6-4", "pool/main/g/ghc/ghc-doc_9.6.6-4_all.deb", "BSD-3-clause", KINDS[3], "html",
             r"html/users_guide/(?!_)(?:[^/]+/)*[^/]+\.html$"),
        _src("maxima", "maxima-doc", "5.47.0-7", "pool/main/m/maxima/maxima-doc_5.47.0-7_all.deb", "GPL-2", KINDS[3],
             "html", r"maxima-doc/html/[^/]+\.html$"),
        _src("sympy", "python-sympy-doc", "1.13.3-5", "pool/main/s/sympy/python-sympy-doc_1.13.3-5_all.deb",
             "BSD-3-clause", KINDS[3], "html", r"python-sympy-doc/html/(?!_)(?:[^/]+/)*[^/]+\.html$"),
    )


def _text(b: bytes, name: str) -> str:
    if name.endswith(".gz"):
        b = gzip.decompress(b)
    return b.decode("utf-8", "replace")


def read_source(s, path: Path) -> list[tuple[str, list[str]]]:
    """The documents [(id, prose paragraphs)] of one non-SWORD, non-Austen v3 source, in a fixed
    order (the archive's paths sorted)."""
    pat = re.compile(s.files)
    files = deb_files(path, lambda n: bool(pat.search(n)))
    keep = lambda paras: markup.prose(paras, s.min_words)  # noqa: E731
    docs: list[tuple[str, list[str]]] = []
    if s.reader == "dictd":
        idx = next(v for k, v in files.items() if k.endswith(".index"))
        dz = next(v for k, v in files.items() if k.endswith(".dz"))
        groups: dict[str, list[str]] = defaultdict(list)
        for head, entry in markup.dictd_entries(idx, dz):
            key = re.sub(r"[^a-z]", "", head.lower())[:2] or "_"
            groups[key] += markup.dictd_paragraphs(entry)
        docs = [(f"{s.name}/{k}", keep(v)) for k, v in sorted(groups.items())]
    elif s.reader == "info":
        by_manual: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
        for name in sorted(files):
            manual = re.sub(r"\.info(-\d+)?\.gz$", "", name.rsplit("/", 1)[-1])
            by_manual[manual] += [(manual, node, paras) for node, paras in markup.info_nodes(_text(files[name], name))]
        docs = [(f"{s.name}/{m}/{node}", keep(paras)) for man in sorted(by_manual) for m, node, paras in by_manual[man]]
    else:
        for name in sorted(files):
            text = _text(files[name], name)
            rel = name.split("/", 3)[-1]
            if s.reader == "html":
                paras = markup.html_blocks(text)
            elif s.reader == "troff":
                paras = markup.troff_paragraphs(text)
            elif s.reader == "text":
                paras = markup.text_paragraphs(text)
            elif s.reader == "json":
                paras = markup.json_documents(files[name])
            elif s.reader in ("fortune", "crawl"):
                recs = markup.separated(text, "%" if s.reader == "fortune" else "%%%%")
                split = markup.text_paragraphs if s.reader == "crawl" else (lambda r: [" ".join(r.split())])
                paras = [p for r in recs for p in split(r)]
            else:
                raise ValueError(f"unknown reader {s.reader!r} for source {s.name}")
            docs.append((f"{s.name}/{rel}", keep(paras)))
    return [(k, v) for k, v in docs if v]
