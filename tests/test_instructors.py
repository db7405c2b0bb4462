"""INSTRUCTORS.md, the instructor's guide, held to the course's sources (issue 31, part 5).

Cheap: the notebook sources are loaded as nbtools builds them (no kernel runs), the checks are read as
text. What is held:

* every chapter of :data:`flashcourse.chapters.CHAPTERS` has a section, ``## Chapter LABEL — TITLE``,
  with 3 to 5 objectives, prerequisites, pitfalls and a 50-minute plan whose minutes run from 0 to 50
  without a gap;
* every cell the plan cites exists: ``NAME`` in the chapter's lecture source, ``ex:NAME`` in its
  solutions source;
* every conceptual question of an exercise has a model answer. The questions are the cells that
  ``nbtools.questions`` writes (named ``questions-K``, "**Question K.**", the answer between solution
  markers, so that the exercise shows ``YOUR ANSWER HERE``); the guide answers each under
  ``**QK** `questions-K` ``, quoting the question word for word, so that a question reworded in its source
  is a question without an answer until the guide is looked at again;
* every check of a chapter has a row in its table of mistakes, and every hint quoted there (between
  curly quotes, ``…`` for what the check fills in) is the text of a string in ``flashcourse/checks``.
"""
from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

import pytest

from flashcourse.chapters import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402

GUIDE = ROOT / "INSTRUCTORS.md"
QUESTION = re.compile(r"questions-\d+")


def words(text: str) -> str:
    return " ".join(text.split())


@cache
def sections(text: str | None = None) -> dict[str, dict[str, str]]:
    """The guide's chapter sections, by chapter label: each ``### Heading``'s text, by heading (and the
    chapter heading's title under ``""``)."""
    text = GUIDE.read_text(encoding="utf-8") if text is None else text
    found = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        m = re.fullmatch(r"Chapter (\w+) — (.+)", head.strip())
        if not m:
            continue
        subs = {"": m[2]}
        for sub in re.split(r"^### ", body, flags=re.M)[1:]:
            title, _, content = sub.partition("\n")
            subs[title.strip()] = content
        found[m[1]] = subs
    return found


@cache
def cells(source: str) -> dict[str, str]:
    """The cells of a notebook source (``lectures/...py``), by name: their text, as nbtools builds them."""
    return {c["metadata"].get("name"): c["source"] for c in nbtools.load_source(ROOT / source).CELLS}


def questions(solution_source: str) -> dict[str, str]:
    """The conceptual questions of an exercise: ``questions-K`` -> the question, without its answer."""
    found = {}
    for name, text in cells(solution_source).items():
        if name and QUESTION.fullmatch(name):
            question = text.split("*Your answer:*")[0]
            found[name] = words(re.sub(r"^\*\*Question \d+\.\*\*", "", question))
    return found


def answers(section: str) -> dict[str, tuple[str, str]]:
    """The model answers of a guide section: ``questions-K`` -> (the quoted question, the answer)."""
    found = {}
    for entry in re.split(r"^(?=\*\*Q\d+\*\* `)", section, flags=re.M)[1:]:
        head, _, rest = entry.partition("\n")
        m = re.fullmatch(r"\*\*Q(\d+)\*\* `(questions-\d+)`", head.strip())
        assert m and m[2] == f"questions-{m[1]}", f"a model answer's heading is {head!r}, expected **QK** `questions-K`"
        lines = rest.strip().split("\n")
        quoted = [line[2:] for line in lines if line.startswith("> ")]
        answer = "\n".join(line for line in lines if not line.startswith(">"))
        found[m[2]] = (words(" ".join(quoted)), words(answer))
    return found


def plan_rows(section: str) -> list[tuple[int, int, list[str]]]:
    """The rows of a 50-minute plan: (from, to, the cells it cites)."""
    rows = []
    for line in section.split("\n"):
        cols = table_cells(line)
        if len(cols) == 4 and (m := re.fullmatch(r"(\d+)–(\d+)", cols[0])):
            rows.append((int(m[1]), int(m[2]), re.findall(r"`([^`]+)`", cols[1])))
    return rows


@cache
def check_strings() -> str:
    """Every string of ``flashcourse/checks/*.py`` (an f-string with ``…`` for each value it fills in), its
    whitespace collapsed, one after another with NUL between them."""
    found = []
    for path in sorted((ROOT / "flashcourse" / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                found.append("".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return "\0".join(words(s) for s in found)


def table_cells(line: str) -> list[str]:
    """The cells of a row of a markdown table (``\\|`` is a ``|`` inside a cell)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def quoted_hints(section: str) -> list[tuple[str, str]]:
    """(check, hint) of each row of a table of mistakes: the check in backquotes, the hint in curly quotes."""
    rows = []
    for line in section.split("\n"):
        cols = table_cells(line)
        if len(cols) == 3 and (hint := re.fullmatch(r"“(.+)”", cols[2])):
            rows.append((cols[0].strip("`"), hint[1]))
    return rows


def is_quoted(hint: str, strings: str) -> bool:
    """Whether each part of ``hint`` between ``…`` marks is in one of ``strings`` (:func:`check_strings`; parts
    under 6 characters, a fragment such as "Q_i and", are not looked for; at least one part is)."""
    parts = [p.strip() for p in words(hint).split("…")]
    looked = [p for p in parts if len(p) >= 6]
    return bool(looked) and all(p in strings for p in looked)


def assert_table(section: str, columns: int, what: str) -> None:
    """Every row of the section's table has ``columns`` cells (a ``|`` in a cell must be written ``\\|``)."""
    bad = [line for line in section.split("\n") if line.startswith("|") and len(table_cells(line)) != columns]
    assert not bad, f"{what}: rows that are not {columns} cells (an unescaped | ?):\n" + "\n".join(bad)


def test_every_chapter_has_a_section():
    assert sorted(sections()) == sorted(c.label for c in CHAPTERS)
    for c in CHAPTERS:
        assert sections()[c.label][""] == c.title, f"chapter {c.label}'s heading: the table calls it {c.title!r}"


@pytest.mark.parametrize("c", CHAPTERS, ids=lambda c: c.label)
def test_objectives_prerequisites_and_pitfalls(c):
    s = sections()[c.label]
    for heading in ("Objectives", "Prerequisites", "A 50-minute class", "Model answers",
                    "Mistakes the checks catch", "Pitfalls"):
        assert s.get(heading, "").strip(), f"chapter {c.label} has no '### {heading}'"
    bullets = re.findall(r"^\* ", s["Objectives"], flags=re.M)
    assert 3 <= len(bullets) <= 5, f"chapter {c.label} has {len(bullets)} objectives; 3 to 5 are asked for"


@pytest.mark.parametrize("c", CHAPTERS, ids=lambda c: c.label)
def test_plan_fills_50_minutes_with_cells_that_exist(c):
    section = sections()[c.label]["A 50-minute class"]
    assert_table(section, 4, f"chapter {c.label}'s plan")
    rows = plan_rows(section)
    assert rows, f"chapter {c.label}'s plan has no rows"
    ends = [0] + [end for _, end, _ in rows]
    assert [start for start, _, _ in rows] == ends[:-1] and ends[-1] == 50, \
        f"chapter {c.label}'s plan must run from 0 to 50 minutes without a gap: {[r[:2] for r in rows]}"
    assert all(start < end for start, end, _ in rows)
    for _, _, cited in rows:
        for name in cited:
            source = c.solution_source if name.startswith("ex:") else c.source
            assert source, f"chapter {c.label}'s plan cites {name!r}, but the chapter has no exercise"
            exists = name.removeprefix("ex:") in cells(source)
            assert exists, f"chapter {c.label}'s plan cites {name!r}, which is not a cell of {source}"


@pytest.mark.parametrize("c", [c for c in CHAPTERS if c.checks], ids=lambda c: c.label)
def test_every_question_has_a_model_answer(c):
    asked, given = questions(c.solution_source), answers(sections()[c.label]["Model answers"])
    assert asked, f"{c.solution_source} asks no question: nbtools.questions writes the cells this test reads"
    for name, question in asked.items():
        answered = name in given
        assert answered, f"{c.solution_source}'s {name} has no model answer in INSTRUCTORS.md:\n{question}"
        quoted, answer = given[name]
        same = quoted == question
        assert same, (f"chapter {c.label}, {name}: the guide answers another question (reworded?):\n"
                      f"the exercise asks: {question}\nthe guide quotes:  {quoted}")
        assert len(answer.split()) >= 15, f"chapter {c.label}, {name}: the model answer is too short"
    assert not set(given) - set(asked), f"chapter {c.label}: answers to questions the exercise does not ask: " \
                                        f"{sorted(set(given) - set(asked))}"


@pytest.mark.parametrize("c", [c for c in CHAPTERS if c.checks], ids=lambda c: c.label)
def test_every_check_has_hints_quoted_from_the_checks(c):
    section = sections()[c.label]["Mistakes the checks catch"]
    assert_table(section, 3, f"chapter {c.label}'s mistakes")
    rows = quoted_hints(section)
    named = {check for check, _ in rows}
    assert set(c.checks) <= named, f"chapter {c.label}: no mistake listed for {sorted(set(c.checks) - named)}"
    for check, hint in rows:
        assert check in c.checks or check == "every kernel check", f"chapter {c.label}: {check!r} is not its check"
        found = is_quoted(hint, check_strings())
        assert found, f"chapter {c.label}, {check}: the hint is not in flashcourse/checks word for word:\n{hint}"


def test_lecture_lengths_are_the_instructor_notes():
    line = next(l for l in GUIDE.read_text(encoding="utf-8").split("\n\n") if "The lecture lengths" in l)
    said = dict(re.findall(r"(\d+[a-z]?): (\d+)", words(line).split("):", 1)[1]))
    notes = {}
    for c in CHAPTERS:
        found = re.search(r"Instructor notes: about (\d+) minutes", (ROOT / c.source).read_text(encoding="utf-8"))
        notes[c.label] = found[1] if found else None
    assert said == notes, f"the guide's lecture lengths {said} are not the lectures' instructor notes {notes}"


def test_the_readers_find_what_they_read():
    # the parsers on a small guide: a question reworded, a cell renamed and a hint invented are each seen
    guide = ("## Chapter 9 — T\n\n### A 50-minute class\n\n| min | cells | what | runs |\n| --- | --- | --- | --- |\n"
             "| 0–20 | `a`, `ex:b` | x | CPU |\n| 20–50 | — | y | — |\n\n### Model answers\n\n"
             "**Q1** `questions-1`\n> Why is\n> it so?\n\nBecause.\n\n### Mistakes the checks catch\n\n"
             "| `merge` | m | “the rescale has the wrong sign: the factors are … both <= 1.” |\n"
             "| `merge` | m | “an invented hint that no check prints” |\n")
    s = sections(guide)["9"]
    assert plan_rows(s["A 50-minute class"]) == [(0, 20, ["a", "ex:b"]), (20, 50, [])]
    assert answers(s["Model answers"]) == {"questions-1": ("Why is it so?", "Because.")}
    (_, real), (_, invented) = quoted_hints(s["Mistakes the checks catch"])
    assert is_quoted(real, check_strings()) and not is_quoted(invented, check_strings())
