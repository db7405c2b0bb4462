"""Chapter 11's ring attention on gloo: rings of 2 and 4 processes on this machine, the kernels in Triton's interpreter.

Each world size is one run of tests/ring_ranks.py (the processes started once, every case inside them). The ring's
output and gradients, gathered into whole sequences, must equal the single-process ``flash_attention``'s and meet
FlashAttention's error rule against float64 (at most twice PyTorch's own fp16 error, plus 1e-3), causal (zigzag)
and not, multi-head and grouped-query; the bytes each rank posts must be what ``formulas.ring`` counts; bad shards get
ValueErrors that name what is wrong. Mutants that fail here: the merge without its rescale, the zigzag halves
swapped, a step's K/V from the wrong rank, the causal mask on every step, dK/dV not sent home.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flashcourse
from flashcourse import backend

from flashcourse.checks.fp16_rule import error_rule  # noqa: E402
from flashcourse.formulas import ring as formulas  # noqa: E402
from flashcourse.reference.attention import attention_float64  # noqa: E402
from flashcourse.reference.backward import attention_backward_float64  # noqa: E402

from test_kernels_backward import torch_grads  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = Path(flashcourse.__file__).resolve().parents[1]
#: Rings of 2 and 4 processes: gloo on the CPU; on GPUs NCCL, one GPU a rank, so only the rings this machine holds.
WORLDS = tuple(w for w in (2, 4) if backend.DEVICE == "cpu" or w <= torch.cuda.device_count())


@pytest.fixture(scope="module")
def rings(tmp_path_factory):
    """{world: what rank 0 of that ring wrote}, each ring run once for the whole module."""
    out = {"seed": int(os.environ.get("FLASHCOURSE_SEED") or secrets.randbits(31))}   # the course's seed rule
    seed = out["seed"]
    if not WORLDS:
        pytest.skip("ring attention on NCCL needs 2 GPUs or more")
    path = tmp_path_factory.mktemp("ring") / "world{world}.pt"
    # the ranks import flashcourse from where this process did: a checkout on PYTHONPATH or not, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(HERE / "ring_ranks.py"), str(path), str(seed), *map(str, WORLDS)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, f"seed {seed}:\n{run.stderr[-3000:]}"
    for world in WORLDS:
        out[world] = torch.load(str(path).format(world=world), weights_only=False)
    return out


def expand(t, heads):
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def torch_output(q, k, v, causal):
    """PyTorch's attention composed of fp16 operations (the reference of chapter 7's tests on the CPU)."""
    k, v = expand(k, q.shape[1]), expand(v, q.shape[1])
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def each_case():
    from ring_ranks import CASES
    return [(w, i) for w in WORLDS for i in range(len(CASES))]


def case_id(wc):
    from ring_ranks import CASES
    N, H, H_kv, d, causal = CASES[wc[1]]
    return f"p{wc[0]}-N{N}-H{H}kv{H_kv}-d{d}-{'causal' if causal else 'full'}"


@pytest.mark.parametrize("world_case", each_case(), ids=case_id)
def test_ring_equals_flash_attention_and_float64(rings, world_case, request):
    world, i = world_case
    request.node.user_properties.append(("seed", rings["seed"]))      # a failure says how to replay it
    r = rings[world]["results"][i]
    N, H, H_kv, d, causal = r["case"]
    q, k, v, do = r["inputs"]
    for name, got, one in zip(("o", "dq", "dk", "dv"), r["ring"], r["single"]):
        assert got.shape == one.shape and got.dtype == one.dtype, (name, got.shape, one.shape)
        assert (got.float() - one.float()).abs().max().item() < 2e-2, f"{name}: ring vs flash_attention"
    ref64 = attention_float64(*(expand(t, H).double().numpy() for t in (q, k, v)), causal=causal)
    rule = error_rule(r["ring"][0], ref64, torch_output(q, k, v, causal))
    assert rule.ok, f"o: error {rule.error:.3g} > bound {rule.bound:.3g}"
    grads64 = attention_backward_float64(*(expand(t, H).double().numpy() for t in (q, k, v)), do.double().numpy(),
                                         causal=causal)
    mine = torch_grads(q, expand(k, H), expand(v, H), do, causal)
    group = H // H_kv
    for name, got, ref, tg in zip(("dq", "dk", "dv"), r["ring"][1:], grads64, mine):
        if name != "dq":      # grouped-query: K/V's gradient sums its query heads'
            ref = ref.reshape(1, H_kv, group, N, d).sum(2)
            tg = tg.reshape(1, H_kv, group, N, d).sum(2)
        rule = error_rule(got, ref, tg)
        assert rule.ok, f"{name}: error {rule.error:.3g} > bound {rule.bound:.3g} (torch {rule.torch_error:.3g})"


@pytest.mark.parametrize("world", WORLDS)
def test_the_bytes_posted_are_the_counted_ones(rings, world):
    for r in rings[world]["results"]:
        N, H, H_kv, d, causal = r["case"]
        per_rank = formulas.ring_bytes(N, H_kv, d, world, dtype_bytes=2)
        assert r["bytes"] == [[per_rank["forward"], per_rank["backward"]]] * world, r["case"]


def test_bad_shards_get_value_errors(rings):
    said = rings[WORLDS[0]]["errors"]
    assert "differ across ranks" in said["mismatched"] and "rank 1 has q (1, 2, 12, 16)" in said["mismatched"]
    assert "expected an even number with causal=True" in said["odd"]
    assert "multiple of H_kv" in said["heads"]
    assert "dtype" in said["dtype"]


def test_the_combine_in_launches_that_keep_offsets_in_int32(monkeypatch):
    """Past 2^31 elements of partials (B H N d >= 2^31: N = 512k, d = 128 at B H = 32) the combine runs in pieces."""
    from flashcourse.distributed import ring
    o_part = torch.randn(1, 3, 40, 3, 16).half().to(backend.DEVICE)
    lse_part = torch.randn(1, 3, 40, 3).to(backend.DEVICE)
    lse_part[0, 0, :5, 1] = float("-inf")                                  # a partial that saw no key
    whole = ring.combine_partials(o_part, lse_part)
    monkeypatch.setattr(ring, "MAX_OFFSET", 16 * 3 * 16 * 2)               # 32 rows a launch: 4 launches of 120 rows
    pieces = ring.combine_partials(o_part, lse_part)
    assert torch.equal(whole[0], pieces[0]) and torch.equal(whole[1], pieces[1])
    w = torch.softmax(lse_part, -1)[..., None]
    assert (whole[0].float() - (w * o_part.float()).sum(-2)).abs().max().item() < 2e-3
