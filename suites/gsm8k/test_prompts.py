"""Prompts are built exactly as each source tool builds them."""

import random

import pytest

from gates.gsm8k.prompts import COT_EXEMPLARS, RECIPES, build_prompts

pytestmark = pytest.mark.cpu


def test_vllm_prompt_is_five_train_shots_then_the_question(test_split, train_split):
    prompt = build_prompts(RECIPES["vllm"], test_split[:2], train_split)[1]
    shots = "".join(f"Question: {p.question}\nAnswer: {p.answer}\n\n" for p in train_split[:5])
    assert prompt == shots + f"Question: {test_split[1].question}\nAnswer:"


def test_sglang_takes_its_shots_from_the_test_split_and_says_it_leaks(test_split, train_split):
    recipe = RECIPES["sglang"]
    prompt = build_prompts(recipe, test_split, train_split)[0]
    assert recipe.leaks and prompt.startswith(f"Question: {test_split[0].question}\nAnswer: {test_split[0].answer}")
    assert prompt.endswith(f"Question: {test_split[0].question}\nAnswer:")  # question 0 sees its own answer


def test_lm_eval_gsm8k_samples_shots_with_seed_1234(test_split, train_split):
    prompts = build_prompts(RECIPES["lm-eval-gsm8k"], test_split[:3], train_split)
    rnd = random.Random(1234)
    for prompt, problem in zip(prompts, test_split[:3]):
        shots = rnd.sample(train_split, 5)
        blocks = [f"Question: {s.question}\nAnswer: {s.answer}" for s in shots]
        assert prompt == "\n\n".join(blocks + [f"Question: {problem.question}\nAnswer:"])
    assert prompts[0] != prompts[1]  # a fresh sample per question


def test_lm_eval_cot_uses_the_eight_exemplars_in_order(test_split, train_split):
    prompt = build_prompts(RECIPES["lm-eval-gsm8k-cot"], test_split[:1], train_split)[0]
    assert len(COT_EXEMPLARS) == 8 and prompt.count("\nA: ") == 8
    assert prompt.startswith("Q: There are 15 trees in the grove.")
    assert prompt.endswith(f"Q: {test_split[0].question}\nA:")


def test_every_recipe_names_its_stops_and_extractors():
    for recipe in RECIPES.values():
        assert recipe.stop and recipe.extractors and recipe.source
