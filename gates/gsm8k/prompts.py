"""Prompt recipes, each as its source builds it (vLLM's gsm8k_eval, SGLang's few_shot_gsm8k, lm-eval's gsm8k tasks).

| recipe            | shots                                      | format                                  | extraction |
|-------------------|--------------------------------------------|-----------------------------------------|------------|
| vllm              | first N of train (default 5)               | Question: q\\nAnswer: a, blank-line joined | last integer |
| sglang            | first N of **test** (leaks: the first N questions see their own answer) | as vllm | last integer |
| lm-eval-gsm8k     | random.Random(1234), N=5 per question from train | as vllm                          | strict-match, flexible-extract |
| lm-eval-gsm8k-cot | the 8 Wei et al. exemplars, in order       | Q: q\\nA: a                               | "The answer is N.", flexible |
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gates.gsm8k.dataset import Problem

# lm-eval gsm8k-cot.yaml fewshot_config.samples (Wei et al. 2022 chain-of-thought exemplars).
COT_EXEMPLARS = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, "
        "there will be 21 trees. How many trees did the grove workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have "
        "been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, "
        "they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did "
        "Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
        "The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. "
        "The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each day, from monday to "
        "thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers "
        "were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf "
        "balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, "
        "he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars "
        "left. 23 - 15 is 8. The answer is 8.",
    ),
)
LM_EVAL_FEWSHOT_SEED = 1234


@dataclass(frozen=True)
class PromptRecipe:
    name: str
    num_shots: int
    stop: tuple[str, ...]
    extractors: tuple[str, ...]  # the first decides correctness; all are reported
    max_tokens: int = 256
    leaks: bool = False
    source: str = ""


RECIPES = {
    "vllm": PromptRecipe(
        "vllm",
        5,
        ("Question", "Assistant:", "<|separator|>"),
        ("last_integer",),
        source="vllm tests/evals/gsm8k/gsm8k_eval.py",
    ),
    "sglang": PromptRecipe(
        "sglang",
        5,
        ("Question", "Assistant:", "<|separator|>"),
        ("last_integer",),
        max_tokens=512,
        leaks=True,
        source="sglang few_shot_gsm8k.py: shots are the first k TEST items (leaks)",
    ),
    "lm-eval-gsm8k": PromptRecipe(
        "lm-eval-gsm8k",
        5,
        ("Question:", "</s>", "<|im_end|>"),
        ("strict_match", "flexible_extract"),
        source="lm-eval gsm8k.yaml v3.0",
    ),
    "lm-eval-gsm8k-cot": PromptRecipe(
        "lm-eval-gsm8k-cot",
        8,
        ("Q:", "</s>", "<|im_end|>"),
        ("cot_strict", "flexible_extract"),
        source="lm-eval gsm8k-cot.yaml",
    ),
}


def _qa(question: str, answer: str | None) -> str:
    return f"Question: {question}\nAnswer:" + ("" if answer is None else f" {answer}")


def build_prompts(
    recipe: PromptRecipe, test: list[Problem], train: list[Problem], num_shots: int | None = None
) -> list[str]:
    """One prompt per test problem, in order."""
    n = recipe.num_shots if num_shots is None else num_shots
    if recipe.name in ("vllm", "sglang"):
        pool = train if recipe.name == "vllm" else test
        header = "".join(_qa(p.question, p.answer) + "\n\n" for p in pool[:n])
        return [header + _qa(p.question, None) for p in test]
    if recipe.name == "lm-eval-gsm8k":
        rnd = random.Random(LM_EVAL_FEWSHOT_SEED)
        prompts = []
        for p in test:
            shots = rnd.sample(train, n)
            prompts.append("\n\n".join([_qa(s.question, s.answer) for s in shots] + [_qa(p.question, None)]))
        return prompts
    if recipe.name == "lm-eval-gsm8k-cot":
        header = "\n\n".join(f"Q: {q}\nA: {a}" for q, a in COT_EXEMPLARS[:n])
        return [(header + "\n\n" if n else "") + f"Q: {p.question}\nA:" for p in test]
    raise ValueError(f"unknown recipe {recipe.name!r}; known: {sorted(RECIPES)}")
