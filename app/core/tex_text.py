"""TeX math as readable text: `$e^{i\\pi}$` -> "eⁱπ", `\\frac{a}{b}` -> "a/b", `\\le` -> "≤".

QTextDocument cannot typeset TeX and the renderer must stay off the file system and the network, so math is
turned into Unicode with <sup>/<sub> where no Unicode super/subscript exists. Returns HTML; input is escaped.
"""
from __future__ import annotations

import html
import re

SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "vartheta": "ϑ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "varpi": "ϖ", "rho": "ρ", "sigma": "σ", "varsigma": "ς", "tau": "τ", "upsilon": "υ",
    "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ",
    "Lambda": "Λ", "Xi": "Ξ", "Pi": "Π", "Sigma": "Σ", "Upsilon": "Υ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "neq": "≠", "ne": "≠", "approx": "≈", "equiv": "≡",
    "sim": "∼", "simeq": "≃", "propto": "∝", "cdot": "⋅", "times": "×", "div": "÷", "pm": "±", "mp": "∓",
    "infty": "∞", "sum": "∑", "prod": "∏", "int": "∫", "oint": "∮", "partial": "∂", "nabla": "∇",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "Leftarrow": "⇐", "leftrightarrow": "↔",
    "Leftrightarrow": "⇔", "mapsto": "↦", "implies": "⇒", "iff": "⇔", "in": "∈", "notin": "∉", "ni": "∋",
    "subset": "⊂", "subseteq": "⊆", "supset": "⊃", "supseteq": "⊇", "cup": "∪", "cap": "∩", "emptyset": "∅",
    "varnothing": "∅", "forall": "∀", "exists": "∃", "neg": "¬", "lnot": "¬", "land": "∧", "wedge": "∧",
    "lor": "∨", "vee": "∨", "oplus": "⊕", "otimes": "⊗", "circ": "∘", "bullet": "•", "star": "⋆",
    "ldots": "…", "cdots": "⋯", "dots": "…", "vdots": "⋮", "ddots": "⋱", "prime": "′", "angle": "∠",
    "perp": "⊥", "parallel": "∥", "mid": "∣", "langle": "⟨", "rangle": "⟩", "lceil": "⌈", "rceil": "⌉",
    "lfloor": "⌊", "rfloor": "⌋", "hbar": "ℏ", "ell": "ℓ", "Re": "ℜ", "Im": "ℑ", "aleph": "ℵ", "deg": "°",
    "quad": "\u2003", "qquad": "\u2003\u2003", ",": "\u2009", ";": "\u2005", ":": "\u2005", "!": "",
    " ": " ", "{": "{", "}": "}", "%": "%", "$": "$", "&": "&", "_": "_", "#": "#", "|": "‖", "\\": " ",
    "lvert": "|", "rvert": "|", "vert": "|", "lVert": "‖", "rVert": "‖", "log": "log", "ln": "ln",
    "exp": "exp", "sin": "sin", "cos": "cos", "tan": "tan", "lim": "lim", "max": "max", "min": "min",
    "det": "det", "dim": "dim", "gcd": "gcd", "arg": "arg", "sup": "sup", "inf": "inf", "Pr": "Pr",
    "top": "⊤", "intercal": "⊺", "dagger": "†", "ast": "∗", "mod": " mod ", "bmod": " mod ",
}
BLACKBOARD = {"R": "ℝ", "N": "ℕ", "Z": "ℤ", "Q": "ℚ", "C": "ℂ", "P": "ℙ", "E": "𝔼"}
SUPER = dict(zip("0123456789+-=()niaeoxhjklmnprstuvwxyzABDEGHIJKLMNOPRTUVW",
                 "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵃᵉᵒˣʰʲᵏˡᵐⁿᵖʳˢᵗᵘᵛʷʸᶻᴬᴮᴰᴱᴳᴴᴵᴶᴷᴸᴹᴺᴼᴾᴿᵀᵁⱽᵂ"))
SUB = dict(zip("0123456789+-=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))
TEXT_COMMANDS = ("text", "mathrm", "mathit", "mathbf", "mathsf", "mathtt", "operatorname", "textbf", "textit",
                 "boldsymbol", "mathcal", "mathscr", "mathfrak", "bm")
DROPPED = ("left", "right", "big", "Big", "bigg", "Bigg", "displaystyle", "limits", "nolimits", "textstyle")
# an environment's delimiters (its rows are shown one a line); any other (aligned, matrix, array…) shows its rows only
ENVIRONMENTS = {"pmatrix": ("(", ")"), "bmatrix": ("[", "]"), "Bmatrix": ("{", "}"), "vmatrix": ("|", "|"),
                "Vmatrix": ("‖", "‖"), "cases": ("{ ", "")}
MAX_CHARS = 2000  # beyond this the source is shown as it is: no pathological input reaches the parser
TOKEN = re.compile(r"\\([A-Za-z]+|.)|([{}^_])|(\s+)|(.)", re.DOTALL)


def tex_html(tex: str) -> str:
    """Readable HTML for a TeX formula (never raises; unknown commands lose only their backslash)."""
    if len(tex) > MAX_CHARS:
        return html.escape(tex)
    tokens = [m for m in TOKEN.finditer(tex)]
    try:
        out, _ = _sequence(tokens, 0, stop_at_brace=False)
    except RecursionError:  # a few hundred nested groups or scripts (`\frac\frac…`, `^^^…`) fit in MAX_CHARS
        return html.escape(tex)
    return out


def _sequence(tokens: list, i: int, stop_at_brace: bool) -> tuple[str, int]:
    parts: list[str] = []
    while i < len(tokens):
        if stop_at_brace and tokens[i].group(2) == "}":
            return "".join(parts), i + 1
        piece, i = _atom(tokens, i)
        parts.append(piece)
    return "".join(parts), i


def _group(tokens: list, i: int) -> tuple[str, str, int]:
    """The next argument: a braced group or one token -> (html, plain text, next index)."""
    while i < len(tokens) and tokens[i].group(3):
        i += 1
    if i >= len(tokens):
        return "", "", i
    if tokens[i].group(2) == "{":
        start = i + 1
        body, j = _sequence(tokens, start, stop_at_brace=True)
        return body, _plain(tokens[start:j - 1]), j
    body, j = _atom(tokens, i)
    return body, _plain(tokens[i:j]), j


def _plain(tokens: list) -> str:
    return "".join(t.group(0) for t in tokens)


def _atom(tokens: list, i: int) -> tuple[str, int]:
    tok = tokens[i]
    command, brace, space, char = tok.group(1), tok.group(2), tok.group(3), tok.group(4)
    if command is not None:
        return _command(command, tokens, i + 1)
    if brace == "{":
        return _sequence(tokens, i + 1, stop_at_brace=True)
    if brace == "}":
        return "", i + 1
    if brace in ("^", "_"):
        body, plain, j = _group(tokens, i + 1)
        return _script(body, plain, brace == "^"), j
    if space is not None or char == "&":  # `&` aligns columns
        return " ", i + 1
    return html.escape(char), i + 1


def _command(name: str, tokens: list, i: int) -> tuple[str, int]:
    if name == "frac" or name == "dfrac" or name == "tfrac":
        top, top_plain, i = _group(tokens, i)
        bottom, bottom_plain, i = _group(tokens, i)
        return f"{_wrap(top, top_plain)}/{_wrap(bottom, bottom_plain)}", i
    if name == "sqrt":
        index, i = _optional(tokens, i)
        body, plain, i = _group(tokens, i)
        return f"{_script(html.escape(index), index, True) if index else ''}√{_wrap(body, plain)}", i
    if name in TEXT_COMMANDS:
        body, _, i = _group(tokens, i)
        return body, i
    if name == "mathbb":
        body, plain, i = _group(tokens, i)
        return "".join(BLACKBOARD.get(c, c) for c in plain) if plain.isalpha() else body, i
    if name in ("hat", "bar", "vec", "tilde", "dot", "overline"):
        body, _, i = _group(tokens, i)
        mark = {"hat": "\u0302", "bar": "\u0304", "vec": "\u20d7", "tilde": "\u0303", "dot": "\u0307",
                "overline": "\u0305"}[name]
        return body + mark, i
    if name in DROPPED:
        return "", i
    arranged = _arranged(name, tokens, i)
    return arranged if arranged is not None else (html.escape(SYMBOLS.get(name, name)), i)


def _arranged(name: str, tokens: list, i: int) -> tuple[str, int] | None:
    """Commands that arrange their arguments (a boxed answer, a binomial, mod, an environment, a new row); None for
    any other. Without this `\\boxed{42}` read "boxed42" and a matrix "beginpmatrix a & b …"."""
    if name == "boxed":
        body, _, i = _group(tokens, i)
        return f"<b>{body}</b>", i
    if name == "binom":
        top, _, i = _group(tokens, i)
        bottom, _, i = _group(tokens, i)
        return f"C({top}, {bottom})", i
    if name == "pmod":
        body, _, i = _group(tokens, i)
        return f" (mod {body})", i
    if name in ("begin", "end"):
        _, env, i = _group(tokens, i)
        if name == "begin" and env == "array":
            _, _, i = _group(tokens, i)  # its column spec
        return ENVIRONMENTS.get(env.strip().rstrip("*"), ("", ""))[name == "end"], i
    if name == "\\":
        return "<br>", i
    return None


def _optional(tokens: list, i: int) -> tuple[str, int]:
    """An optional `[…]` argument's plain text (a root's index), and the index after it."""
    j = i
    while j < len(tokens) and tokens[j].group(3):
        j += 1
    if j >= len(tokens) or tokens[j].group(4) != "[":
        return "", i
    end = next((k for k in range(j + 1, len(tokens)) if tokens[k].group(4) == "]"), None)
    return ("", i) if end is None else (_plain(tokens[j + 1:end]), end + 1)


def _wrap(body: str, plain: str) -> str:
    """Parentheses around a compound numerator, denominator or radicand: (a+b)/2, not a+b/2."""
    return body if len(plain.strip("{} ")) <= 1 or plain.strip().isalnum() else f"({body})"


def _script(body: str, plain: str, up: bool) -> str:
    table = SUPER if up else SUB
    text = plain.strip("{}")
    if text and all(c in table for c in text):
        return "".join(table[c] for c in text)
    return f"<sup>{body}</sup>" if up else f"<sub>{body}</sub>"
