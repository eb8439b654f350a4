"""The download button of every chapter offers the executed notebook (.ipynb) next to the MyST
source (.md).

sphinx-book-theme only adds the .ipynb entry when a launch service (Binder, Colab...) is
configured; this book has none (it builds and reads offline).  Before the theme builds its header
buttons, this copies the notebook that MyST-NB executed during the build
(``_build/jupyter_execute/<page>.ipynb``) into ``_sources/`` and tells the theme about it.
"""
from pathlib import Path
from shutil import copy2


def add_ipynb_source(app, pagename, templatename, context, doctree):
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if doctree is None or not executed.exists():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app):
    app.connect("html-page-context", add_ipynb_source, priority=500)   # the theme's buttons: 501
    return {"parallel_read_safe": True, "parallel_write_safe": True}
