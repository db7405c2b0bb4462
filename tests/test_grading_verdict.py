"""Issue 32's holes in the verdict, each tried with payloads written for it and run through the real verdict
(:func:`flashcourse.grading.run_verdict`: the verdict's process and its worker), without a notebook run: a
solution that answers from a table of the hidden cases, reads the grader's seed, or tells grading from
practice (class 3); that rewrites the verdict's results or its memory (class 4). On main every payload here
passed its checks (shown with a notebook each, graded by main's `flashcourse grade`); each is refused now.

Several payloads share one verdict where they do not interfere (each fakes another check), so that the
payloads of a class cost one or two verdicts (a few seconds each), not a notebook run each.
"""
import contextlib
import hashlib
import io
import json
import os
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
    rows, channel, _ = run_verdict(Snapshot.take(), job, timeout=60)
    assert channel == []
    return {r["name"]: (r["status"], r["message"]) for r in rows}


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


# ---------------------------------------------------------------------------------------------
# class 4: the verdict's result channel

#: Wrong answers everywhere: every check fails (rather than "not implemented"), and its status is the word
#: "failed", the same length as "passed", which is what the payloads rewrite.
WRONG = ("def online_step(m, d, x_j):\n    return x_j, 1.0\n"
         "def merge(m_a, l_a, m_b, l_b):\n    return m_a, l_a\n")

#: A daemon forked from a solution cell (it outlives the worker until the verdict's supervisor ends), doing
#: BODY every half millisecond to whatever results file it finds beside the verdict's scratch folder.
DAEMON = textwrap.dedent("""
    import glob, os, time
    def _daemon(body):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for _ in range(100000):
                    for path in glob.glob("/tmp/flashcourse-verdict-*/results.json") + glob.glob("../results.json"):
                        try:
                            body(path)
                        except Exception:
                            pass
                    time.sleep(0.0005)
                os._exit(0)
            os._exit(0)
    """)

#: A results file whose every check passed, made where nothing limits the size of a file (a cell of the
#: notebook); the worker then links it over the real one and puts a folder where the verdict writes the next.
FAKE_RESULTS = "/tmp/flashcourse-issue32-fake-results.json"

HARD_LINK = DAEMON + textwrap.dedent(f"""
    def _link(path):
        os.link({FAKE_RESULTS!r}, path + ".tmp")
        os.replace(path + ".tmp", path)
        os.mkdir(path + ".part")             # and the verdict's next results cannot be written
        os._exit(0)
    _daemon(_link)
    """)

MMAP = DAEMON + textwrap.dedent("""
    import mmap
    def _rewrite(path):
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            at = mm.find(b'"failed"')
            while at >= 0:
                mm[at:at + 8] = b'"passed"'
                at = mm.find(b'"failed"')
    _daemon(_rewrite)
    """)

#: The verdict's own memory: every str "failed" (a compact ASCII string of 6: its length 48 bytes before its
#: text, on CPython 3.11) rewritten to "passed" through /proc/PID/mem of the worker's parent.
PROC_MEM = textwrap.dedent("""
    import os, re, sys
    def _rewrite_parent():
        head = 48 if sys.version_info < (3, 12) else 40
        pid = os.getppid()
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            for line in maps:
                lo, hi, perms = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\\S+)", line).groups()
                if "rw" not in perms:
                    continue
                lo, hi = int(lo, 16), int(hi, 16)
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except OSError:
                    continue
                for m in re.finditer(rb"failed\\x00", data):
                    at = m.start() - head
                    if at >= 0 and data[at + 16:at + 24] == (6).to_bytes(8, "little"):
                        mem.seek(lo + m.start())
                        mem.write(b"passed")
    try:
        _rewrite_parent()
    except OSError:
        pass
    """)

#: The new channel, tried the same way: a line for every descriptor of the worker's parent (the verdict).
PIPE = textwrap.dedent("""
    import json, os
    for fd in os.listdir(f"/proc/{os.getppid()}/fd") if os.access(f"/proc/{os.getppid()}/fd", os.R_OK) else []:
        try:
            with open(f"/proc/{os.getppid()}/fd/{fd}", "w") as f:
                f.write(json.dumps({"token": "?", "rows": [{"name": "merge", "status": "passed", "message": ""}]}) + "\\n")
        except OSError:
            pass
    """)


@pytest.mark.slow
def test_no_solution_reaches_the_verdicts_results(tmp_path):
    """Issue 32, class 4: on main each of these (from a solution cell, so in the worker) turned every failed check
    into a passed one: a results file linked over the verdict's, its "failed" rewritten through mmap, the verdict's
    own strings rewritten through /proc/PID/mem. The results now travel over a pipe only the verdict holds, the
    verdict is non-dumpable, and the worker runs without privileges: each payload (and writing to the verdict's
    descriptors) finds nothing it can reach, and every wrong answer fails."""
    rows = [{"name": n, "status": "passed", "message": ""} for n in ("online_softmax", "merge", "softmax_kernel")]
    with open(FAKE_RESULTS, "w") as f:
        json.dump(rows, f)
    try:
        got = verdict([("a", WRONG), ("b", HARD_LINK), ("c", MMAP), ("d", PROC_MEM), ("e", PIPE)])
    finally:
        os.unlink(FAKE_RESULTS)
    assert {name: status for name, (status, _) in got.items()} == {"online_softmax": "failed", "merge": "failed"}, got
