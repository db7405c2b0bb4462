"""Chapter 9's checks: the paged KV cache's bookkeeping in NumPy (:func:`cache_step`); the page walk of the
paged decoding kernel in Triton is :mod:`flashcourse.checks.paged_walk`'s, the prediction of how many requests
fit :mod:`flashcourse.checks.paged_predict`'s.

**The cache** (:func:`cache_step`) is plain data, as the grader passes it between processes: a dict with
``pages`` (num_blocks, block_size, d), the pool of blocks (one token a row); ``refs`` (num_blocks,) ints, how many
block tables hold each block; ``free``, the list of free blocks; ``tables``, each sequence's block table (its
blocks in logical order); ``lens``, each sequence's number of tokens. The student's ``cache_step(cache, op)``
applies one request, ``("append", seq, x)``, ``("fork", parent, child)`` or ``("free", seq)``, and returns the
cache. The check drives it through scripted and random streams of requests and, after each, holds the cache to
what any right allocator gives (it does not ask for particular block numbers): every sequence reads back the
tokens it was given, through ``ceil(n / block_size)`` blocks; each block's count is the number of tables that
hold it; the free list holds exactly the blocks no table holds; an append changes at most the sequence's last
block, and that one only when it was shared; a fork copies nothing. When the cache is wrong it names the rule
broken and, where it can tell, the mistake (a block too many at a block's end, a write into a shared block, a
block given back while another sequence holds it, a copy that forgot the rows already written).

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def never_shares(cache, op):                          # a fork that copies every block
    ...     return cache
    >>> checks.cache_step(never_shares)                       # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: cache_step: ...
"""
from __future__ import annotations

import copy

import numpy as np

from .cases import Case, call, join_lines, passed, require_callable, seed_of

__all__ = ["cache_step"]


# ---------------------------------------------------------------------------------------------
# Exercise 1: the cache's bookkeeping (blocks, reference counts, copy-on-write), in NumPy.

_KEYS = ("pages", "refs", "free", "tables", "lens")

_BOUNDARY_HINT = ("a sequence of n tokens holds ceil(n / block_size) blocks: its token n (counting from 0) goes to "
                  "row n % block_size of its last block, and it needs a new block exactly when that row is 0 (the "
                  "last block is full, or there is none yet) -- not one token earlier or later.")
_COW_HINT = ("copy-on-write: before writing a token into a block that another table holds too (its count is above "
             "1), take a free block, copy the rows already written into it, put it in the sequence's table in "
             "place of the shared one, and let the shared one go (its count drops by one). Never write into a "
             "shared block.")
_FULL_HINT = ("when an append needs a block (a new one, or one to copy a shared block into) and the free list is "
              "empty, the pool is full: raise CacheFull (imported at the top), and the caller waits, preempts a "
              "sequence or fails the request.")
_FREED_SHARED_HINT = ("a block goes back to the free list only when no table holds it any more (its count drops to "
                      "0); while another sequence (a fork) still holds it, freeing one sequence only lowers the count.")


def new_cache(num_blocks: int, block_size: int, d: int, order=None) -> dict:
    """An empty cache as :func:`cache_step` takes it: every block free (handed out in ``order``, default 0, 1,
    ..., by ``free.pop()``), the pool's rows NaN until written.

    Example:
        >>> c = new_cache(4, 2, 3)
        >>> c["pages"].shape, c["refs"].tolist(), c["free"], c["tables"], c["lens"]
        ((4, 2, 3), [0, 0, 0, 0], [3, 2, 1, 0], {}, {})
    """
    order = list(range(num_blocks)) if order is None else [int(b) for b in order]
    return {"pages": np.full((num_blocks, block_size, d), np.nan), "refs": np.zeros(num_blocks, np.int64),
            "free": order[::-1], "tables": {}, "lens": {}}


def shown_streams():
    """The shown cases of :func:`cache_step`: ``(kind, num_blocks, block_size, d, order, ops)``, fixed.

    Example:
        >>> [kind for kind, *_ in shown_streams()][:2]
        ['one sequence of 9 tokens: three blocks, the last one partial', 'a sequence ending exactly at a block boundary, then one more token']
    """
    g = np.random.default_rng(9)

    def toks(seq, n):
        return [("append", seq, g.normal(size=3).round(2)) for _ in range(n)]
    return [
        ("one sequence of 9 tokens: three blocks, the last one partial", 8, 4, 3, None, toks("a", 9)),
        ("a sequence ending exactly at a block boundary, then one more token", 8, 4, 3, None, toks("a", 8) + toks("a", 1)),
        ("a fork in the middle of a block, then both append: copy-on-write of the shared last block", 8, 4, 3,
         [5, 2, 7, 0, 1, 3, 4, 6], toks("a", 6) + [("fork", "a", "b")] + toks("b", 1) + toks("a", 2) + toks("b", 3)),
        ("a fork at a block boundary: the shared blocks are full, so the next token needs a new block, not a copy",
         8, 4, 3, None, toks("a", 8) + [("fork", "a", "b")] + toks("b", 2) + toks("a", 1)),
        ("free a parent whose blocks its fork still holds, then start a new sequence", 8, 4, 3, [3, 1, 4, 0, 5, 2, 7, 6],
         toks("a", 6) + [("fork", "a", "b"), ("free", "a")] + toks("c", 9) + toks("b", 1)),
        ("length 1: a one-token sequence, forked twice and freed", 6, 2, 3, None,
         toks("a", 1) + [("fork", "a", "b"), ("fork", "b", "c")] + toks("c", 1) + [("free", "b"), ("free", "a")]
         + toks("c", 2)),
    ]


HIDDEN_KINDS = ("random requests, blocks of 1 token", "random requests, pages out of order",
                "random requests with many forks", "random requests with many frees",
                "random requests, blocks of 8 tokens", "random requests, pages out of order",
                "the pool runs out: the append that needs a block raises CacheFull")


def needs_block(cache: dict, op) -> bool:
    """Whether request ``op`` takes a block from the free list: an append whose sequence has no room in its last
    block (it is full, or there is none), or whose last block another table holds too (copy-on-write).

    Example:
        >>> c = new_cache(2, 2, 1)
        >>> needs_block(c, ("append", "a", [1.0])), needs_block(c, ("fork", "a", "b"))
        (True, False)
    """
    if op[0] != "append":
        return False
    n, table = cache["lens"].get(op[1], 0), cache["tables"].get(op[1], [])
    return n % cache["pages"].shape[1] == 0 or cache["refs"][table[-1]] > 1


def full_pool_stream(rng):
    """A hidden case of :func:`cache_step`: ``(num_blocks, block_size, d, order, ops)``, appends and forks on a pool
    of 3-6 blocks until an append needs a block that is not there (the last request, which must raise CacheFull).

    Example:
        >>> nb, bs, d, order, ops = full_pool_stream(np.random.default_rng(0))
        >>> cache = new_cache(nb, bs, d, order)
        >>> for op in ops[:-1]:
        ...     assert not (needs_block(cache, op) and not cache["free"])
        ...     cache = apply_request(cache, op)
        >>> needs_block(cache, ops[-1]) and not cache["free"]
        True
    """
    nb, bs, d = int(rng.integers(3, 7)), int(rng.choice([2, 3, 4])), int(rng.integers(1, 4))
    order = rng.permutation(nb).tolist()
    cache, names, ops = new_cache(nb, bs, d, order), iter(f"s{i}" for i in range(100)), []
    while True:
        lens = cache["lens"]
        if lens and len(lens) < 4 and rng.random() < 0.2:
            op = ("fork", str(rng.choice(sorted(lens))), next(names))
        else:
            seq = next(names) if not lens or rng.random() < 0.15 else str(rng.choice(sorted(lens)))
            op = ("append", seq, rng.normal(size=d).round(3))
        ops.append(op)
        if needs_block(cache, op) and not cache["free"]:
            return nb, bs, d, order, ops
        cache = apply_request(cache, op)


def apply_request(cache: dict, op) -> dict:
    """``op`` applied to a copy of ``cache`` by the rules :func:`cache_step` holds a student to (blocks taken with
    ``free.pop()``); what the hidden streams are built with, never what a student's cache is compared with.

    Example:
        >>> c = apply_request(new_cache(2, 2, 1), ("append", "a", [1.0]))
        >>> c["tables"], c["lens"], c["refs"].tolist()
        ({'a': [0]}, {'a': 1}, [1, 0])
    """
    cache = copy.deepcopy(cache)
    pages, refs, free, tables, lens = (cache[k] for k in _KEYS)
    if op[0] == "append":
        table, n = tables.setdefault(op[1], []), lens.get(op[1], 0)
        row = n % pages.shape[1]
        if row == 0 or refs[table[-1]] > 1:
            own = free.pop()
            refs[own] = 1
            if row:
                pages[own, :row] = pages[table[-1], :row]
                refs[table[-1]] -= 1
                table[-1] = own
            else:
                table.append(own)
        pages[table[-1], row], lens[op[1]] = op[2], n + 1
    elif op[0] == "fork":
        tables[op[2]], lens[op[2]] = list(tables[op[1]]), lens[op[1]]
        refs[tables[op[2]]] += 1
    else:
        for b in tables.pop(op[1]):
            refs[b] -= 1
            free += [b] if refs[b] == 0 else []
        del lens[op[1]]
    return cache


def random_stream(rng, kind: str):
    """A hidden case of :func:`cache_step`: ``(num_blocks, block_size, d, order, ops)``, a stream of 40 requests
    on 2-5 sequences drawn from ``rng``, the pool large enough never to run out.

    Example:
        >>> nb, bs, d, order, ops = random_stream(np.random.default_rng(0), HIDDEN_KINDS[1])
        >>> len(ops), sorted(order) == list(range(nb))
        (40, True)
    """
    if kind.startswith("the pool runs out"):
        return full_pool_stream(rng)
    block_size = 1 if "1 token" in kind else 8 if "8 tokens" in kind else int(rng.choice([2, 3, 4, 5]))
    d = int(rng.integers(1, 4))
    p_fork, p_free = (0.25, 0.08) if "forks" in kind else (0.1, 0.2) if "frees" in kind else (0.12, 0.08)
    lens, names, ops = {}, iter(f"s{i}" for i in range(1000)), []
    for _ in range(40):
        r = rng.random()
        if lens and r < p_fork and len(lens) < 5:
            parent = str(rng.choice(sorted(lens)))
            child = next(names)
            ops.append(("fork", parent, child))
            lens[child] = lens[parent]
        elif len(lens) > 1 and r < p_fork + p_free:
            seq = str(rng.choice(sorted(lens)))
            ops.append(("free", seq))
            del lens[seq]
        else:
            seq = next(names) if not lens or (len(lens) < 3 and rng.random() < 0.2) else str(rng.choice(sorted(lens)))
            ops.append(("append", seq, rng.normal(size=d).round(3)))
            lens[seq] = lens.get(seq, 0) + 1
    num_blocks = 44 * 5 // block_size + 48            # more than the 40 tokens and the copies can need
    order = rng.permutation(num_blocks).tolist() if "out of order" in kind else None
    return num_blocks, block_size, d, order, ops


def _show_op(op) -> str:
    if op[0] == "append":
        return f"('append', {op[1]!r}, x)"
    return repr(tuple(op))


class _StreamCase(Case):
    def describe(self) -> str:
        e = self.extra
        return (f"{self.where()}: num_blocks = {e['num_blocks']}, block_size = {e['block_size']}, d = {e['d']}; "
                f"request {e['step']} of {e['steps']}, {e['op']}, after {e['before']}")


def _bad(name: str, case, what: str, hint: str, replay: str) -> AssertionError:
    return AssertionError(join_lines(f"{name}: {what} on {case.describe()}", f"hint: {join_lines(hint, replay)}"))


def _structure(name: str, got, case, nb: int, bs: int, d: int):
    if not isinstance(got, dict) or any(k not in got for k in _KEYS):
        have = sorted(got) if isinstance(got, dict) else type(got).__name__
        raise AssertionError(f"{name} must return the cache, a dict with the keys {list(_KEYS)}; it returned "
                             f"{have!r} on {case.describe()} (did you forget `return cache`?)")
    pages, refs = np.asarray(got["pages"]), np.asarray(got["refs"])
    if pages.shape != (nb, bs, d) or refs.shape != (nb,):
        raise AssertionError(f"{name} returned pages of shape {pages.shape} and refs of shape {refs.shape}, expected "
                             f"{(nb, bs, d)} and {(nb,)} on {case.describe()}: the pool never grows or shrinks")
    tables, lens, free = got["tables"], got["lens"], got["free"]
    if not isinstance(tables, dict) or not isinstance(lens, dict) or not isinstance(free, (list, tuple)):
        raise AssertionError(f"{name} returned tables, lens and free of types {type(tables).__name__}, "
                             f"{type(lens).__name__}, {type(free).__name__}; expected a dict, a dict and a list, on "
                             f"{case.describe()}")
    for seq, table in tables.items():
        if not isinstance(table, (list, tuple)) or any(isinstance(b, bool) or not isinstance(b, (int, np.integer))
                                                       or not 0 <= b < nb for b in table):
            raise AssertionError(f"{name}: the block table of {seq!r} is {table!r}, not a list of blocks in "
                                 f"[0, {nb}), on {case.describe()}")
    for b in free:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < nb:
            raise AssertionError(f"{name}: the free list holds {b!r}, not a block in [0, {nb}), on {case.describe()}")
    return pages.astype(np.float64), refs, {s: [int(b) for b in t] for s, t in tables.items()}, \
        {s: lens[s] for s in lens}, [int(b) for b in free]


def _judge(name, case, replay, op, before, got, tokens, nb, bs, d):
    """Hold the cache ``got`` after ``op`` (``before``: the student's cache before it) to the rules; ``tokens``:
    each sequence's tokens so far, as the check keeps them."""
    pages, refs, tables, lens, free = _structure(name, got, case, nb, bs, d)
    kind = op[0]
    b_pages, b_refs, b_tables = np.asarray(before["pages"], dtype=np.float64), np.asarray(before["refs"]), before["tables"]
    if set(tables) != set(tokens) or set(lens) != set(tokens):
        missing, extra = sorted(set(tokens) - set(tables)), sorted((set(tables) | set(lens)) - set(tokens))
        what = (f"tables has {sorted(tables)} and lens {sorted(lens)}, but the sequences are {sorted(tokens)}")
        hint = ("free removes the sequence from tables and lens" if kind == "free" and extra else
                "fork gives the child a table and a length of its own" if kind == "fork" else
                "a sequence's first append starts its table and length" if missing else "")
        raise _bad(name, case, what, hint or "tables and lens hold exactly the sequences that hold a cache", replay)
    for seq, toks in tokens.items():
        if lens[seq] != len(toks):
            raise _bad(name, case, f"lens[{seq!r}] is {lens[seq]!r}, expected {len(toks)}",
                       "an append adds one token; a fork's child starts with its parent's length", replay)
    for seq, toks in tokens.items():
        need = -(-len(toks) // bs)
        if len(tables[seq]) != need:
            raise _bad(name, case, f"the table of {seq!r} has {len(tables[seq])} blocks for {len(toks)} tokens, "
                       f"expected ceil({len(toks)} / {bs}) = {need}", _BOUNDARY_HINT, replay)
    if kind == "fork" and tables[op[2]] != tables[op[1]]:
        raise _bad(name, case, f"the child's table is {tables[op[2]]}, its parent's {tables[op[1]]}",
                   "a fork copies nothing: the child's table lists the parent's blocks, which both now share", replay)
    if kind == "append":
        seq, old, new = op[1], list(b_tables.get(op[1], [])), tables[op[1]]
        row = (len(tokens[seq]) - 1) % bs
        kept = old if row == 0 else old[:-1]
        if new[:len(kept)] != kept:
            raise _bad(name, case, f"the append changed the table of {seq!r} from {old} to {new}",
                       "an append writes one row of the last block (or of a new block after it): the full blocks "
                       "before it stay where they are, even when shared (nothing is written into them)", replay)
        if row and int(b_refs[old[-1]]) == 1 and new[-1] != old[-1]:
            raise _bad(name, case, f"block {old[-1]}, the last block of {seq!r}, was held by its table alone, "
                       f"yet the append moved the sequence to block {new[-1]}",
                       "copy a block only when another table holds it too (its count is above 1): a block of "
                       "one's own is written in place", replay)
        if row and int(b_refs[old[-1]]) > 1 and new[-1] == old[-1]:
            raise _bad(name, case, f"the append wrote token {len(tokens[seq]) - 1} of {seq!r} into block {old[-1]}, "
                       f"which {int(b_refs[old[-1]])} tables held", _COW_HINT, replay)
    holders = np.zeros(nb, np.int64)
    for table in tables.values():
        for b in table:
            holders[b] += 1
    if len(set(free)) != len(free):
        dup = next(b for b in free if free.count(b) > 1)
        raise _bad(name, case, f"block {dup} is on the free list twice", _FREED_SHARED_HINT, replay)
    held_free = [b for b in free if holders[b]]
    if held_free:
        b = held_free[0]
        who = [s for s, t in tables.items() if b in t]
        raise _bad(name, case, f"block {b} is on the free list, but the table of {who[0]!r} holds it",
                   _FREED_SHARED_HINT if kind == "free" else
                   "a block taken for a sequence leaves the free list (take it with free.pop())", replay)
    lost = [b for b in range(nb) if not holders[b] and b not in free]
    if lost:
        raise _bad(name, case, f"block {lost[0]} is held by no table, yet it is not on the free list",
                   "the blocks a sequence lets go of (when it is freed, or when it copies a shared block) return to "
                   "the free list once no table holds them: else the pool leaks", replay)
    wrong = np.flatnonzero(np.asarray(refs) != holders)
    if wrong.size:
        b = int(wrong[0])
        hint = {"fork": "a fork adds one to the count of every block the child now shares",
                "free": "freeing a sequence takes one from the count of each of its blocks"}.get(
            kind, "a new block's count is 1; when a shared block is copied, the copy's count is 1 and the shared "
                  "one's drops by one (this table no longer holds it)")
        raise _bad(name, case, f"refs[{b}] is {int(refs[b])}, but {int(holders[b])} block table(s) hold block {b}",
                   hint, replay)
    for seq, toks in tokens.items():
        table = tables[seq]
        for t, x in enumerate(toks):
            block, row = table[t // bs], t % bs
            if not np.array_equal(pages[block, row], np.asarray(x, dtype=np.float64)):
                hint = _content_hint(op, seq, t, bs, b_tables, b_refs, b_pages, block, row, x, tokens)
                raise _bad(name, case, f"token {t} of {seq!r} should be in block {block} (its table's entry "
                           f"{t // bs}), row {row}: {np.asarray(x).tolist()}, but that row holds "
                           f"{pages[block, row].tolist()}", hint, replay)


def _content_hint(op, seq, t, bs, b_tables, b_refs, b_pages, block, row, x, tokens) -> str:
    """Why token ``t`` of ``seq`` is not where its table says, after ``op``."""
    if op[0] == "append" and seq != op[1] and block in b_tables.get(op[1], []):
        return "the append wrote into a block that another sequence holds too. " + _COW_HINT
    if op[0] == "append" and seq == op[1] and t < len(tokens[seq]) - 1:
        return ("after the copy the rows already written are missing from the new block: copy rows 0 .. row - 1 of "
                "the shared block before writing the new token at its row. " + _COW_HINT)
    if op[0] == "append" and seq != op[1]:
        return ("the append overwrote a block that still belongs to another sequence: was it given back to the free "
                "list too early? " + _FREED_SHARED_HINT)
    if op[0] == "append":
        return "the new token goes to row n % block_size of the sequence's last block (n: its tokens before it). " + \
            _BOUNDARY_HINT
    return "a fork or a free writes no token; the rows of the blocks stay as they are"


def _raises_cache_full(name, fn, state, op, case, replay) -> None:
    """The append ``op`` needs a block and the free list is empty: ``fn`` must raise CacheFull (by name: under a
    grade the worker's CacheFull is its own class of that name)."""
    try:
        call(name, fn, (copy.deepcopy(state), (op[0], op[1], np.array(op[2]))), case)
    except AssertionError as e:
        cause = e.__cause__
        if type(cause).__name__ == "CacheFull":
            return
        raise _bad(name, case, f"raised {type(cause).__name__}: {cause} where the append needed a block and the free "
                               f"list was empty", _FULL_HINT, replay) from cause
    raise _bad(name, case, "returned a cache though the append needed a block and the free list was empty",
               _FULL_HINT, replay)


def cache_step(fn, seed: int | None = None) -> None:
    """Check ``fn(cache, op) -> cache``, one request to a paged KV cache (see the module's docstring for the
    cache): ``("append", seq, x)`` writes ``x`` (d,) as ``seq``'s next token (a new sequence starts empty), taking
    a free block when the last one is full and copying the last block first when another table holds it too
    (copy-on-write); ``("fork", parent, child)`` gives ``child`` the parent's blocks, shared; ``("free", seq)``
    drops ``seq``, each of its blocks returning to the free list once no table holds it.

    6 shown streams of requests and 7 hidden ones: 6 of 40 requests each (blocks of 1 to 8 tokens, pools handed
    out in a shuffled order, many forks, many frees), and one on a small pool that ends with an append that needs
    a block when none is free, which must raise ``CacheFull``; after every request the cache is held to the rules,
    with the sequence of requests so far in the message.

    Example:
        >>> def no_copy_on_write(cache, op):               # appends in place, shared or not; forks; frees
        ...     pages, refs, free, tables, lens = (cache[k] for k in _KEYS)
        ...     if op[0] == "append":
        ...         table, n = tables.setdefault(op[1], []), lens.get(op[1], 0)
        ...         if n % pages.shape[1] == 0:
        ...             table.append(free.pop())
        ...             refs[table[-1]] = 1
        ...         pages[table[-1], n % pages.shape[1]], lens[op[1]] = op[2], n + 1
        ...     elif op[0] == "fork":
        ...         tables[op[2]], lens[op[2]] = list(tables[op[1]]), lens[op[1]]
        ...         refs[tables[op[2]]] += 1
        ...     else:
        ...         for b in tables.pop(op[1]):
        ...             refs[b] -= 1
        ...             free += [b] if refs[b] == 0 else []
        ...         del lens[op[1]]
        ...     return cache
        >>> cache_step(no_copy_on_write)                       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: cache_step: the append wrote token 6 of 'b' into block 2, which 2 tables held on shown case 3 of 6 ...
        ...
    """
    name = "cache_step"
    require_callable(name, fn, "check.cache_step(cache_step)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    streams = [(kind, nb, bs, d, order, ops, False) for kind, nb, bs, d, order, ops in shown_streams()]
    n_shown = len(streams)
    streams += [(kind, *random_stream(rng, kind), True) for kind in HIDDEN_KINDS]
    replay_hidden = f"check.cache_step(cache_step, seed={seed}) draws this hidden case again."
    for i, (kind, nb, bs, d, order, ops, hidden) in enumerate(streams):
        number, of = (i - n_shown + 1, len(HIDDEN_KINDS)) if hidden else (i + 1, n_shown)
        replay = replay_hidden if hidden else ""
        state, tokens = new_cache(nb, bs, d, order), {}
        for step, op in enumerate(ops):
            shown_before = ", ".join(_show_op(o) for o in ops[max(0, step - 6):step])
            extra = dict(num_blocks=nb, block_size=bs, d=d, step=step + 1, steps=len(ops), op=_show_op(op),
                         before=(f"... {shown_before}" if step > 6 else shown_before) or "an empty cache")
            case = _StreamCase(kind, (), number, of, hidden, seed, (), extra)
            if needs_block(state, op) and not state["free"]:       # the stream's last request: the pool is full
                _raises_cache_full(name, fn, state, op, case, replay)
                break
            before = copy.deepcopy(state)
            # the student's function gets a copy (as in the grader's worker, where every call crosses a pipe)
            got = call(name, fn, (copy.deepcopy(state), (op[0], op[1], np.array(op[2])) if op[0] == "append" else op),
                       case)
            if op[0] == "append":
                tokens.setdefault(op[1], []).append(np.asarray(op[2], dtype=np.float64))
            elif op[0] == "fork":
                tokens[op[2]] = list(tokens[op[1]])
            else:
                del tokens[op[1]]
            _judge(name, case, replay, op, before, got, tokens, nb, bs, d)
            state = got
    passed(name, n_shown, len(HIDDEN_KINDS))
