"""Answer extraction, exactly as each source tool does it (vLLM's gsm8k_eval, SGLang's few_shot_gsm8k, lm-eval's gsm8k
tasks, openai/grade-school-math's dataset.py).

* ``last_integer`` - vLLM's gsm8k_eval and SGLang: remove commas, take the last ``\\d+``; no match is
  INVALID. Signs and decimals are ignored, symmetrically for the label.
* ``strict_match`` - lm-eval ``gsm8k`` strict-match: ``#### (-?[0-9.,]+)``, first match.
* ``flexible_extract`` - lm-eval flexible-extract: ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, last match, first
  non-empty group.
* ``cot_strict`` - lm-eval ``gsm8k_cot`` strict-match: ``The answer is (-?[0-9.,]+).``
lm-eval answers are compared after its ``regexes_to_ignore`` (``,``, ``$``, ``(?s).*#### ``, ``\\.$``)
and case folding; a non-match is ``[invalid]``.
"""

from __future__ import annotations

import re

INVALID = "[invalid]"
_LAST_INT = re.compile(r"\d+")
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_COT_STRICT = re.compile(r"The answer is (\-?[0-9\.\,]+).")
_IGNORE = [re.compile(p) for p in (r",", r"\$", r"(?s).*#### ", r"\.$")]


def last_integer(text: str) -> str:
    found = _LAST_INT.findall(text.replace(",", ""))
    return str(int(found[-1])) if found else INVALID


def lm_eval_normalize(text: str) -> str:
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.strip().lower()


def _first_group(pattern: re.Pattern, text: str) -> str:
    """lm-eval's regex filter with take_first: group 1 of the first match, or INVALID."""
    m = pattern.search(text)
    return m.group(1).strip() if m else INVALID


def strict_match(text: str) -> str:
    return _first_group(_STRICT, text)


def flexible_extract(text: str) -> str:
    matches = _FLEXIBLE.findall(text)
    if not matches:
        return INVALID
    groups = matches[-1]
    return next((g for g in groups if g), INVALID).strip()


def cot_strict(text: str) -> str:
    return _first_group(_COT_STRICT, text)


def gold_number(answer: str) -> str:
    """The reference number of a GSM8K solution (after '####'), commas removed."""
    number = strict_match(answer)
    if number == INVALID:
        raise ValueError(f"GSM8K solution without '#### <number>': {answer[-80:]!r}")
    return number.replace(",", "")


EXTRACTORS = {
    "last_integer": last_integer,
    "strict_match": strict_match,
    "flexible_extract": flexible_extract,
    "cot_strict": cot_strict,
}


def is_correct(extractor: str, completion: str, answer: str) -> tuple[bool, bool]:
    """(correct, invalid) for one completion under one extractor, labels made as the source makes them."""
    got = EXTRACTORS[extractor](completion)
    if got == INVALID:
        return False, True
    if extractor == "last_integer":
        return got == last_integer(answer), False
    return lm_eval_normalize(got) == lm_eval_normalize(gold_number(answer)), False
