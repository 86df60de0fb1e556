"""A study's results table as LaTeX (``results.tex``, booktabs), for a paper: the same cells as report.md's table."""

from __future__ import annotations

# characters of the report's cells and headers, as LaTeX writes them (text mode; math where it is math)
_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "ε": r"$\varepsilon$",
    "∞": r"$\infty$",
    "–": "--",
    "×": r"$\times$",
    "≤": r"$\le$",
}


def escape(text: str) -> str:
    """``text`` as LaTeX prints it: its special characters escaped, its symbols in math mode."""
    return "".join(_LATEX.get(char, char) for char in str(text))


def latex_table(header: list[str], rows: list[list[str]], caption: str) -> str:
    """A booktabs ``table`` of ``rows`` under ``header`` (needs ``\\usepackage{booktabs}``), the first columns (the
    settings) left-aligned, the numbers right-aligned."""
    numeric = [all(_numeric(row[i]) for row in rows) if rows else False for i in range(len(header))]
    spec = "".join("r" if n else "l" for n in numeric)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{escape(caption)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(escape(h) for h in header) + r" \\",
        r"\midrule",
        *(" & ".join(escape(cell) for cell in row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def _numeric(cell: str) -> bool:
    head = str(cell).split(" ")[0].replace("/", "")
    return head in ("–", "∞", "mixed") or head.replace(".", "", 1).replace("e-", "", 1).isdigit()
