"""Answer extraction on tricky completions, per source tool."""

import pytest

from gates.gsm8k.extract import (
    INVALID,
    cot_strict,
    flexible_extract,
    gold_number,
    is_correct,
    last_integer,
    lm_eval_normalize,
    strict_match,
)

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(
    "text, want",
    [
        ("The total is 1,234 apples.", "1234"),  # thousands comma
        ("She owes -10 dollars", "10"),  # vLLM ignores the sign (and does so for labels too)
        ("It costs $18.", "18"),  # dollar and trailing period
        ("3.5 hours, so the answer is 7", "7"),  # last integer wins
        ("no number here", INVALID),
        ("#### 72\n\nQuestion: 5 apples", "5"),  # what comes after is read too: stop sequences matter
    ],
)
def test_last_integer(text, want):
    assert last_integer(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("so 5 + 7 = 12\n#### 12", "12"),
        ("#### 1,234.", "1,234."),
        ("#### -3", "-3"),
        ("The answer is 12", INVALID),
    ],
)
def test_lm_eval_strict(text, want):
    assert strict_match(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("The answer is $1,234.", "$1,234."),
        ("He has 5 apples and then 12.", "12."),
        ("-7 degrees", "-7"),
        ("nothing", INVALID),
    ],
)
def test_lm_eval_flexible_takes_the_last_match(text, want):
    assert flexible_extract(text) == want


def test_lm_eval_normalization_matches_the_gold_number():
    assert lm_eval_normalize("$1,234.") == "1234" == lm_eval_normalize(gold_number("blah <<a=b>>\n#### 1,234"))
    assert cot_strict("So 3 + 4 = 7. The answer is 7.") == "7"  # the pattern's final "." eats the period
    assert lm_eval_normalize(cot_strict("The answer is 7.")) == "7"


@pytest.mark.parametrize(
    "extractor, text, answer, want",
    [
        ("last_integer", "... #### 1,234", "x\n#### 1,234", (True, False)),
        ("strict_match", "#### -10", "x\n#### -10", (True, False)),
        ("strict_match", "#### 10", "x\n#### -10", (False, False)),  # lm-eval keeps the sign
        ("last_integer", "-10", "x\n#### -10", (True, False)),  # vLLM drops it on both sides
        ("flexible_extract", "It is $5.", "x\n#### 5", (True, False)),
        ("cot_strict", "I think 5", "x\n#### 5", (False, True)),
    ],
)
def test_is_correct(extractor, text, answer, want):
    assert is_correct(extractor, text, answer) == want


def test_every_test_answer_has_a_gold_number(test_split):
    numbers = [gold_number(p.answer) for p in test_split]
    assert sum(n.startswith("-") for n in numbers) == 2  # test.jsonl's answers -10 and -3
    assert not any("." in n for n in numbers)
