"""Every "it learns" threshold in the test suite keeps a margin that holds across CPUs.

A seeded run differs between CPUs (other vector units round differently, and a few epochs
amplify it), so a threshold set just under what one machine reached is a machine check, not a
learning check (issue 44: 0.338 on another CPU against ">= 0.35", where this one reached
0.62). Each assertion that compares a learning metric (accuracy, loss, ROUGE, perplexity,
top-5) with a float literal says where its number comes from, in a comment of a fixed form
on its own lines or in the comment block just above it:

    # seeds 1-5: 0.48-0.54; untrained 0

(the asserted quantity's lowest-highest value over the seeds, measured on this machine, and
its value for a model that learned nothing), or, for a bound that is no learning threshold
(a metric's range, a documented acceptance target):

    # exempt: <why>

The rule (docs/testing.md, "How learning thresholds are chosen"): the threshold lies between
the untrained value U and the worst measured seed W, at most a third of the way from U to W
(a run that learns a third as much as the worst seed here still passes; issue 44's other CPU
learned about half as much) and at least a tenth of the way (a model that learned nothing
fails by more than noise).
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

METRIC_WORDS = {"accuracy", "acc", "loss", "losses", "rouge", "rougel", "perplexity", "top"}
MEASURED = re.compile(r"#\s*seeds (\d+)-(\d+): ([-\d.e]+)-([-\d.e]+); untrained ([-\d.e]+)")
EXEMPT = re.compile(r"#\s*exempt: \S")
FAR_FROM_WORST = 2 / 3  # of the way from untrained to the worst seed: kept free below it
FROM_UNTRAINED = 0.1  # of that way: the threshold is at least this far from learning nothing
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# Known and not yet fixed, by file and the comparison's source (a stale entry fails below).
# test_gpu_check.py is another change's: 2.4 is above ln 10 = 2.30, the loss at chance, so a
# peer that learned nothing could pass it.
KNOWN = {("tests/distributed/test_gpu_check.py", '0 < n["train_loss"] < 2.4')}


@dataclass
class Threshold:
    where: str
    source: str  # the comparison as written
    value: float
    lower: bool  # the quantity must be above the value (accuracy), else below it (loss)
    comments: list[str]


def _metric_words(node: ast.AST) -> set[str]:
    words = set()
    for sub in ast.walk(node):
        text = (sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute)
                else sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                else "")
        words |= set(re.split(r"[^a-z]+", text.lower()))
    return words & METRIC_WORDS


def _floats(node: ast.AST) -> list[ast.Constant]:
    """Float literals outside pytest.approx(...) (an equality with a tolerance)."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "approx":
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        return [node]
    return [f for child in ast.iter_child_nodes(node) for f in _floats(child)]


def _comments(source: str) -> dict[int, str]:
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(
        io.StringIO(source).readline) if tok.type == tokenize.COMMENT}


def thresholds(source: str, name: str, known: set | None = None
               ) -> tuple[list[Threshold], list[str]]:
    """The learning thresholds of one test module, and what is wrong with its assertions'
    shape (a learning threshold is ``quantity OP literal``, one comparison)."""
    comments, lines = _comments(source), source.splitlines()
    found, problems, known = [], [], set() if known is None else known
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)
                    and any(isinstance(op, ORDER) for op in c.ops)
                    and _floats(c) and _metric_words(c)]
        if not compares:
            continue
        # the comments on the assertion's lines and the block of comment lines just above
        mine = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above = node.lineno - 1
        while above >= 1 and lines[above - 1].strip().startswith("#"):
            mine.insert(0, comments.get(above, ""))
            above -= 1
        where = f"{name}:{node.lineno}"
        if any(EXEMPT.search(c) for c in mine):
            continue
        for cmp in compares:
            text = ast.get_source_segment(source, cmp)
            if (name, text) in KNOWN:
                known.add((name, text))
                continue
            left, right = cmp.left, cmp.comparators[0]
            if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ORDER) or len(_floats(cmp)) != 1:
                problems.append(f"{where}: write a learning threshold as `quantity OP literal`")
                continue
            literal_left = isinstance(left, ast.Constant) and isinstance(left.value, float)
            literal = left if literal_left else right
            if not (isinstance(literal, ast.Constant) and isinstance(literal.value, float)):
                problems.append(f"{where}: compare a named quantity with a bare literal "
                                "(a ratio or a gain), not an expression holding it")
                continue
            above_it = isinstance(cmp.ops[0], (ast.Gt, ast.GtE))
            found.append(Threshold(where, text, literal.value, above_it != literal_left, mine))
    return found, problems


def verdict(threshold: Threshold) -> str | None:
    """None if the threshold keeps the margin, else why not."""
    for comment in reversed(threshold.comments):  # the nearest one
        match = MEASURED.search(comment)
        if match:
            break
    else:
        return (f"{threshold.where}: no '# seeds A-B: LOW-HIGH; untrained U' (or '# exempt: "
                "why') comment")
    first, last, low, high, untrained = match.groups()
    low, high, untrained, value = float(low), float(high), float(untrained), threshold.value
    if int(first) >= int(last) or low > high:
        return f"{threshold.where}: '{match.group(0)}' is not a range over several seeds"
    worst = low if threshold.lower else high
    gap = (worst - untrained) if threshold.lower else (untrained - worst)
    if gap <= 0:
        return f"{threshold.where}: the worst seed ({worst}) did not learn (untrained {untrained})"
    how_far = ((value - untrained) if threshold.lower else (untrained - value)) / gap
    if how_far > 1 - FAR_FROM_WORST:
        return (f"{threshold.where}: {value} is {how_far:.0%} of the way from untrained "
                f"{untrained} to the worst seed {worst}: at most {1 - FAR_FROM_WORST:.0%}")
    if how_far < FROM_UNTRAINED:
        return (f"{threshold.where}: {value} is only {how_far:.0%} of the way from untrained "
                f"{untrained} to the worst seed {worst}: learning nothing could pass")
    return None


def _suite() -> list[Path]:
    return sorted((REPO / "tests").rglob("test_*.py"))


def test_every_learning_threshold_keeps_its_margin():
    problems, count, known = [], 0, set()
    for path in _suite():
        found, shape = thresholds(path.read_text(), str(path.relative_to(REPO)), known)
        problems += shape + [v for t in found if (v := verdict(t))]
        count += len(found)
    assert not problems, "\n".join(problems)
    assert known == KNOWN, f"fixed or changed, drop from KNOWN: {KNOWN - known}"
    assert count >= 6, count  # the learning tests of cifar, imagewoof, xsum, mnist


def _check(source: str) -> list[str]:
    found, problems = thresholds(textwrap.dedent(source), "planted.py")
    return problems + [v for t in found if (v := verdict(t))]


def test_a_threshold_just_under_the_measured_value_is_caught():
    # issue 44's assertion as it was, with the range this machine measured
    problems = _check("""
        def test_x(results):
            # seeds 1-5: 0.46-0.62; untrained 0.10
            assert results["final"]["val"]["accuracy"] >= 0.35, results
    """)
    assert len(problems) == 1 and "0.35 is 69% of the way" in problems[0], problems


def test_an_upper_bound_on_loss_too_close_to_the_measured_loss_is_caught():
    problems = _check("""
        def test_x(ratio_loss):
            assert ratio_loss < 0.7  # seeds 1-5: 0.44-0.66; untrained 1.0
    """)
    assert len(problems) == 1 and "0.7 is 88% of the way" in problems[0], problems


def test_a_threshold_that_learning_nothing_passes_is_caught():
    problems = _check("""
        def test_x(accuracy_gain):
            # seeds 1-3: 0.4-0.5; untrained 0
            assert accuracy_gain > 0.01
    """)
    assert len(problems) == 1 and "learning nothing could pass" in problems[0], problems


def test_a_threshold_without_its_measurement_is_caught():
    problems = _check("""
        def test_x(test):
            assert 0.30 <= test["top5_accuracy"]  # chance is 0.10
            assert test["loss"] < 0.8 * first_loss
    """)
    assert len(problems) == 2, problems
    assert "planted.py:3: no '# seeds" in problems[0] or "planted.py:3: no '# seeds" in problems[1]
    assert any("planted.py:4: compare a named quantity" in p for p in problems), problems


def test_margins_exemptions_and_other_assertions_pass():
    assert _check("""
        def test_x(test, accuracy_gain, loss_ratio, peak_bytes):
            # a comment of another kind, then the measurement
            # seeds 1-5: 0.36-0.52; untrained 0
            assert accuracy_gain >= 0.10, test
            assert (
                loss_ratio < 0.9  # seeds 1-5: 0.44-0.66; untrained 1
            )
            assert test["rouge1"] <= 1.0  # exempt: ROUGE's range, not a threshold
            assert test["loss"] == pytest.approx(1.5, rel=0.02)  # an equality
            assert peak_bytes < 1.5e9  # no learning metric
            assert test["loss"] > 0  # an int: a sign, not a threshold
    """) == []
