"""Issue 32's holes in the verdict, each tried with payloads written for it and run through the real verdict
(:func:`flashcourse.grading.run_verdict`: the verdict's process and its worker), without a notebook run: a
solution that answers from a table of the hidden cases, reads the grader's seed, or tells grading from
practice. On main every payload here passed its checks; each is refused now.

Several payloads share one verdict where they do not interfere (each fakes another check), so that the
payloads of a class cost one or two verdicts (a few seconds each), not a notebook run each.
"""
import contextlib
import hashlib
import io
import json
import secrets
import textwrap

import numpy as np
import pytest

from flashcourse import checks
from flashcourse.grading import run_verdict, verdict_job
from flashcourse.grading.integrity import Snapshot
from solution_cells import completed

NAME = "01_online_softmax"
ONLINE_CELL, MERGE_CELL = "01-online-softmax-online-softmax", "01-online-softmax-merge"
#: The seed every grade used before issue 32 (a constant of the grader's, passed to the worker's environment).
OLD_SEED = 20_251_123


def solution(cell_id: str, name: str = NAME) -> str:
    return next(c.source for c in completed(name).cells if c.get("id") == cell_id)


def verdict(cells, checks=("online_softmax", "merge"), seed=None, name=NAME) -> dict:
    """{check: (status, message)} of the real verdict on ``cells`` ((id, source) pairs), for ``checks`` only."""
    job = verdict_job(name, cells, secrets.randbits(32) if seed is None else seed)
    job["checks"] = [c for c in job["checks"] if c["name"] in checks]
    return {r["name"]: (r["status"], r["message"]) for r in run_verdict(Snapshot.take(), job, timeout=60)}


def _key(args) -> str:
    return hashlib.sha256(b"".join(np.asarray(a, dtype=np.float64).tobytes() for a in args)).hexdigest()


def tables(seed: int):
    """What a student could have recorded of the graded cases at ``seed``: merge's answers by their inputs,
    and online_step's in the order the check calls it (the solutions' own functions, run under the check)."""
    ns = {}
    exec("import numpy as np\n" + solution(ONLINE_CELL) + "\n" + solution(MERGE_CELL), ns)
    merge_table, steps = {}, []

    def merge(*args):
        got = ns["merge"](*args)
        merge_table[_key(args)] = [np.asarray(x, dtype=np.float64).tolist() for x in got]
        return got

    def online_step(*args):
        got = ns["online_step"](*args)
        steps.append([float(x) for x in got])
        return got
    with contextlib.redirect_stdout(io.StringIO()):
        checks.merge(merge, seed=seed)
        checks.online_softmax(online_step, seed=seed)
    return merge_table, steps


KEY = textwrap.dedent("""
    import hashlib, json, os
    import numpy as np
    def _key(args):
        return hashlib.sha256(b"".join(np.asarray(a, dtype=np.float64).tobytes() for a in args)).hexdigest()
    """)


def input_table(merge_table) -> str:
    """merge answered from a table of the graded cases' inputs (wrong on anything else)."""
    return KEY + textwrap.dedent(f"""
        _TABLE = json.loads({json.dumps(merge_table)!r})
        def merge(m_a, l_a, m_b, l_b):
            got = _TABLE.get(_key((m_a, l_a, m_b, l_b)))
            return (np.asarray(got[0]), np.asarray(got[1])) if got else (m_a, l_a)
        """)


def call_order(steps) -> str:
    """online_step answered in the order the graded check calls it."""
    return textwrap.dedent(f"""
        import json
        import numpy as np
        _ANSWERS = iter(json.loads({json.dumps(steps)!r}))
        def online_step(m, d, x_j):
            got = next(_ANSWERS, None)
            return tuple(got) if got else (max(m, x_j), d + 1.0)
        """)


def env_switch(merge_table) -> str:
    """Wrong in practice; the table only when the worker's environment says it is graded (it did: the seed)."""
    return KEY + textwrap.dedent(f"""
        _TABLE = json.loads({json.dumps(merge_table)!r})
        def merge(m_a, l_a, m_b, l_b):
            got = _TABLE.get(_key((m_a, l_a, m_b, l_b)))
            if got and any("SEED" in k or "GRADE" in k for k in os.environ):
                return np.asarray(got[0]), np.asarray(got[1])
            return np.maximum(m_a, m_b), l_a + l_b
        """)


@pytest.fixture(scope="module")
def old_tables():
    return tables(OLD_SEED)


@pytest.mark.slow
def test_tables_of_the_hidden_cases_fail_a_grade_with_a_fresh_seed(old_tables):
    """Issue 32, class 3: on main the grade's seed was a constant (20251123), so a table of its cases passed:
    merge's by input, online_step's by call order. Now each grade draws a secret seed of its own, which the
    messages name so that the instructor (or ``--seed``) draws the failing case again."""
    merge_table, steps = old_tables
    seed = 987_654_321
    got = verdict([("a", call_order(steps)), ("b", input_table(merge_table))], seed=seed)
    for name, (status, message) in got.items():
        assert status == "failed" and f"seed={seed}" in message, (name, message)


@pytest.mark.slow
def test_the_seed_repeats_a_grade_and_the_worker_never_learns_it(old_tables):
    """``--seed S`` draws grade S's cases again (the call-order table for S passes: the same calls, the same order);
    yet the worker's environment does not tell it is graded (on main it held the seed), so the switch that
    answers from the table only when graded never does."""
    merge_table, steps = old_tables
    got = verdict([("a", call_order(steps)), ("b", env_switch(merge_table))], seed=OLD_SEED)
    assert got["online_softmax"][0] == "passed", got
    assert got["merge"][0] == "failed", got
