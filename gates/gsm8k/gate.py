"""Score answers and decide: candidate backend vs baseline on the same questions.

Accuracy with its standard error (lm-eval's: sample standard deviation / sqrt(n)), the invalid-answer
rate, and a paired exact McNemar test on per-question correctness (one-sided: is the candidate worse?).
The declared rule (:class:`GateRule`) fails the candidate when any of these holds:

* its accuracy is below ``accuracy_threshold - tolerance`` (vLLM's absolute gate), when a threshold is set;
* it lost more than ``max_drop`` accuracy against the baseline AND the loss is significant
  (McNemar p < ``alpha``): a real regression, not noise;
* its invalid-answer rate is above ``max_invalid_rate``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from gates.gsm8k.dataset import Problem
from gates.gsm8k.extract import EXTRACTORS, is_correct


@dataclass(frozen=True)
class GateRule:
    accuracy_threshold: float | None = None
    tolerance: float = 0.0
    max_drop: float = 0.02
    alpha: float = 0.05
    max_invalid_rate: float | None = 0.10


@dataclass
class Score:
    extractor: str
    correct: list[bool]
    invalid: list[bool]

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / self.n if self.n else 0.0

    @property
    def stderr(self) -> float:
        p, n = self.accuracy, self.n
        return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else float("nan")

    @property
    def invalid_rate(self) -> float:
        return sum(self.invalid) / self.n if self.n else 0.0


def score(problems: list[Problem], completions: dict[int, str], extractor: str) -> Score:
    """Per-question correctness; a question without a completion counts as wrong and invalid."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown extractor {extractor!r}")
    correct, invalid = [], []
    for p in problems:
        text = completions.get(p.index)
        ok, bad = (False, True) if text is None else is_correct(extractor, text, p.answer)
        correct.append(ok)
        invalid.append(bad)
    return Score(extractor, correct, invalid)


@dataclass
class Verdict:
    passed: bool
    reasons: list[str]
    baseline_accuracy: float
    candidate_accuracy: float
    baseline_stderr: float
    candidate_stderr: float
    drop: float
    mcnemar_p: float
    worse: list[int] = field(default_factory=list)  # right in baseline, wrong in candidate
    better: list[int] = field(default_factory=list)  # wrong in baseline, right in candidate
    candidate_invalid_rate: float = 0.0
    n: int = 0
    extractor: str = ""
    rule: dict = field(default_factory=dict)


def mcnemar_worse_p(worse: int, better: int) -> float:
    """One-sided exact McNemar: P(at least ``worse`` of the discordant pairs go against the candidate)."""
    if worse + better == 0:
        return 1.0
    from scipy.stats import binomtest  # here: scipy.stats is ~1 s of imports a config error need not pay

    return binomtest(worse, worse + better, 0.5, alternative="greater").pvalue


def decide(baseline: Score, candidate: Score, rule: GateRule) -> Verdict:
    if baseline.n != candidate.n:
        raise ValueError(f"baseline scored {baseline.n} questions, candidate {candidate.n}: not paired")
    worse = [i for i, (b, c) in enumerate(zip(baseline.correct, candidate.correct)) if b and not c]
    better = [i for i, (b, c) in enumerate(zip(baseline.correct, candidate.correct)) if c and not b]
    p = mcnemar_worse_p(len(worse), len(better))
    drop = baseline.accuracy - candidate.accuracy
    reasons = []
    if rule.accuracy_threshold is not None and candidate.accuracy < rule.accuracy_threshold - rule.tolerance:
        reasons.append(
            f"accuracy {candidate.accuracy:.4f} < threshold {rule.accuracy_threshold} - tolerance {rule.tolerance}"
        )
    if drop > rule.max_drop and p < rule.alpha:
        reasons.append(
            f"accuracy dropped {drop:.4f} > {rule.max_drop} vs baseline, significant (McNemar p={p:.3g} < {rule.alpha})"
        )
    if rule.max_invalid_rate is not None and candidate.invalid_rate > rule.max_invalid_rate:
        reasons.append(f"invalid-answer rate {candidate.invalid_rate:.4f} > {rule.max_invalid_rate}")
    return Verdict(
        not reasons,
        reasons,
        baseline.accuracy,
        candidate.accuracy,
        baseline.stderr,
        candidate.stderr,
        drop,
        p,
        worse,
        better,
        candidate.invalid_rate,
        candidate.n,
        candidate.extractor,
        asdict(rule),
    )


def report_json(verdict: Verdict, problems: list[Problem], extra: dict | None = None) -> str:
    flipped = {
        "worse": [{"index": i, "question": problems[i].question[:200]} for i in verdict.worse],
        "better": [{"index": i, "question": problems[i].question[:200]} for i in verdict.better],
    }
    body = {**asdict(verdict), "flipped": flipped, **(extra or {})}
    body.pop("worse"), body.pop("better")
    return json.dumps(body, indent=1)


def report_markdown(verdict: Verdict, problems: list[Problem], names=("baseline", "candidate")) -> str:
    lines = [
        f"# GSM8K gate: {'PASS' if verdict.passed else 'FAIL'}",
        "",
        f"{verdict.n} questions, extractor `{verdict.extractor}`, rule {verdict.rule}",
        "",
        "| | accuracy | stderr |",
        "|---|---|---|",
        f"| {names[0]} | {verdict.baseline_accuracy:.4f} | {verdict.baseline_stderr:.4f} |",
        f"| {names[1]} | {verdict.candidate_accuracy:.4f} | {verdict.candidate_stderr:.4f} |",
        "",
        f"drop {verdict.drop:+.4f}; flips: {len(verdict.worse)} worse, {len(verdict.better)} better; "
        f"McNemar one-sided p = {verdict.mcnemar_p:.4g}; candidate invalid rate {verdict.candidate_invalid_rate:.4f}",
    ]
    if verdict.reasons:
        lines += ["", "Reasons:"] + [f"- {r}" for r in verdict.reasons]
    if verdict.worse:
        lines += ["", "Questions the candidate got wrong and the baseline right:"]
        lines += [f"- #{i}: {problems[i].question[:120]}" for i in verdict.worse[:50]]
    return "\n".join(lines) + "\n"
