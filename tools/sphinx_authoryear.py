"""Author-year labels in the bibliography ("Schwethelm et al., 2026"), matching the author-year
citations in the text, instead of pybtex's numeric [1], [2], ...

Registers a pybtex label style and a formatting style ``authoryear`` (the ``plain`` style with
these labels); ``bibtex_default_style: authoryear`` in the book's configuration selects it.
"""
from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _surname(person) -> str:
    return " ".join(person.last_names).replace("{", "").replace("}", "")


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        """Labels in entry order; equal labels get a, b, ... after the year (Zhu et al., 2025a)."""
        labels = list(self._labels(sorted_entries))
        seen = {}
        for label in labels:
            if labels.count(label) == 1:
                yield label
            else:
                seen[label] = seen.get(label, -1) + 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label]]

    def _labels(self, sorted_entries):
        for entry in sorted_entries:
            people = list(entry.persons.get("author", []))
            names = [_surname(p) for p in people if _surname(p).lower() != "others"]
            if not names:
                names = ["Anon."]
            if len(people) > 2 or (len(people) == 2 and len(names) == 1):
                who = f"{names[0]} et al."
            elif len(names) == 2:
                who = f"{names[0]} and {names[1]}"
            else:
                who = names[0]
            yield f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(PlainStyle):
    default_label_style = "authoryear"


def setup(app):
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
