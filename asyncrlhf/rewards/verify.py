"""A math verifier for decoded responses: extract the final answer, compare it with the
reference exactly when both are numbers, symbolically (sympy) otherwise.

The final answer is, in order of precedence: the text after the last ``####`` (the
GSM8K convention), the content of the last ``\\boxed{...}``, the last number in the
text. ``42``, ``42.0``, ``42.00``, ``$42``, ``1,234`` and ``84/2`` all equal ``42``;
``1/2`` equals ``0.5``; ``x+1`` equals ``1+x``.

Symbolic comparison can take unbounded time on a pathological expression (``9**9**9``):
run this verifier in :class:`~asyncrlhf.rewards.decoded.DecodedReward`'s process pool,
which kills a row that exceeds its timeout.

Example:
    >>> math_score("so the total is 18.\\n#### 18", "18")
    1.0
    >>> math_score("The answer is \\\\boxed{\\\\frac{1}{2}}", "0.5")
    1.0
    >>> math_score("I think 7, or maybe 8", "7")
    0.0
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["exact_text", "extract_answer", "math_equal", "math_score"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unclosed


def extract_answer(text: str) -> str | None:
    """The response's final answer as text (see the module), or None if it has none."""
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _clean(answer: str) -> str:
    answer = _FRAC.sub(r"(\1)/(\2)", answer)
    for junk in ("$", "\\!", "\\,", "\\left", "\\right", "\\%", "%", "\\"):
        answer = answer.replace(junk, "")
    return answer.strip().rstrip(".").replace(" ", "")


def _as_number(answer: str) -> Fraction | None:
    text = answer.replace(",", "")
    if re.fullmatch(r"\(?-?[\d.]+\)?/\(?[\d.]+\)?", text):
        top, bottom = (part.strip("()") for part in text.split("/"))
        try:
            return Fraction(top) / Fraction(bottom)
        except (ValueError, ZeroDivisionError):
            return None
    try:
        return Fraction(text)
    except ValueError:
        return None


def math_equal(predicted: str, reference: str) -> bool:
    """Whether two final answers are equal: as exact rationals when both parse as
    numbers, else as sympy expressions whose difference simplifies to zero."""
    pred, ref = _clean(predicted), _clean(reference)
    if pred == ref:
        return True
    a, b = _as_number(pred), _as_number(ref)
    if a is not None and b is not None:
        return a == b
    # An expression on either side ("2^3" against "8", "x+1" against "1+x"): sympy decides.
    from sympy import simplify
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    try:
        difference = parse_expr(pred, transformations=transformations) - parse_expr(
            ref, transformations=transformations
        )
        return bool(simplify(difference) == 0)
    except Exception:  # not an expression sympy can read: unequal
        return False


def math_score(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference's (a reference with
    ``####`` or ``\\boxed{}`` is reduced to its final answer too), else 0.0."""
    predicted = extract_answer(response)
    if predicted is None:
        return 0.0
    wanted = extract_answer(reference) if ("####" in reference or "\\boxed" in reference) else reference
    return 1.0 if wanted is not None and math_equal(predicted, wanted) else 0.0


def exact_text(response: str, reference: str) -> float:
    """1.0 when the response is the reference, surrounding whitespace aside: the decoded
    counterpart of the tensor-native ``exact_match``."""
    return 1.0 if response.strip() == reference.strip() else 0.0
