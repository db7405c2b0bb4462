"""Chapter 9's serving engine against HuggingFace ``generate`` on the same requests (lab/paged.md, "The engine").

A random Llama-architecture model (no download: ``LlamaConfig`` with 16 layers, hidden 2048, 16 query heads
sharing 4 K/V heads of d = 128, vocabulary 32000; weights N(0, 0.05); fp16) serves 256 requests that all arrive at t = 0, with
prompts of mixed lengths (log-normal, 8..1024 tokens) and budgets of 16..256 new tokens (uniform), greedy:

* ``hf generate bs=N`` (N = 64, 128, 256): ``model.generate`` (SDPA, its dynamic cache) on static batches of N requests in arrival
  order, left-padded, each batch run to its longest budget; a request's tokens are its own budget's first ones;
* ``engine`` and ``engine (no graphs)``: :class:`flashcourse.paged_engine.Engine`, continuous batching over pages
  of 16 tokens (at most 256 requests at once), its decoding steps replayed from CUDA graphs or launched eagerly;
  each engine serves the workload once untimed first (Triton compiles kernels for each new prefill shape).

Throughput is the requests' generated tokens (their budgets) over the wall time of the whole run. For the engine:
time to first token and the time between a request's tokens (percentiles, ms), and the cache's used / reserved
token slots at every decoding step; for ``generate``, used / reserved of its padded batches (prompt + budget of
each request over the batch's rows x (longest prompt + longest budget)). First, 8 requests' engine tokens against
``generate`` on each alone, compared up to the first step whose top two logits lie within 0.05 (a near tie the two
paths' fp16 rounding may break either way).

    PYTHONPATH=. python lab/gpu_paged_engine.py OUT.json
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.paged_engine import Engine  # noqa: E402

N_REQUESTS, BLOCK, MAX_BATCH, NUM_BLOCKS = 256, 16, 256, 8192
TIE = 0.05


def model_and_requests():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=2048,
                         initializer_range=0.05)       # (HF's 0.02 leaves the logits of a random model nearly tied)
    model = LlamaForCausalLM(config).half().cuda().eval()
    model.set_attn_implementation("sdpa")
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 32000) for _ in range(min(1024, max(8, int(rng.lognormvariate(5.0, 0.8)))))]
               for _ in range(N_REQUESTS)]
    budgets = [rng.randint(16, 256) for _ in range(N_REQUESTS)]
    return model, prompts, budgets


def hf_generate(model, prompts, budgets, bs):
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs, used, reserved = [], 0, 0
    for i in range(0, len(prompts), bs):
        ps, bud = prompts[i:i + bs], budgets[i:i + bs]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device="cuda")
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max(bud), min_new_tokens=max(bud),
                             do_sample=False, pad_token_id=0)
        outputs += [row[width:width + n].tolist() for row, n in zip(out, bud)]
        used += sum(len(p) + n for p, n in zip(ps, bud))
        reserved += len(ps) * (width + max(bud))
    torch.cuda.synchronize()
    return outputs, time.perf_counter() - start, used / reserved


def serve(model, prompts, budgets, cuda_graphs):
    engine = Engine(model, num_blocks=NUM_BLOCKS, block_size=BLOCK, max_batch=MAX_BATCH, cuda_graphs=cuda_graphs)
    t0 = time.perf_counter()
    graphs = engine.runner.capture(MAX_BATCH)
    capture_s = time.perf_counter() - t0
    engine.generate(prompts, budgets)            # once untimed: Triton compiles each prefill shape's kernels once
    torch.cuda.synchronize()
    start = time.perf_counter()
    requests = [engine.add(p, n) for p, n in zip(prompts, budgets)]
    stamps = {r.id: [] for r in requests}
    ratios, batch_sizes = [], []
    while engine.scheduler.has_work():
        made = engine.step()
        now = time.perf_counter() - start
        for r, _ in made:
            stamps[r.id].append(now)
        used, reserved = engine.scheduler.usage()
        if reserved:
            ratios.append(used / reserved)
        batch_sizes.append(len(made))
    wall = time.perf_counter() - start
    ttft = [s[0] * 1e3 for s in stamps.values()]
    itl = [float(x) * 1e3 for s in stamps.values() for x in np.diff(s)]
    pct = lambda xs: {f"p{q}": round(float(np.percentile(xs, q)), 2) for q in (50, 90, 99)}  # noqa: E731
    return [r.output for r in requests], wall, {
        "ttft_ms": pct(ttft), "inter_token_ms": pct(itl), "used_over_reserved_mean": round(float(np.mean(ratios)), 4),
        "used_over_reserved_min": round(float(np.min(ratios)), 4), "mean_tokens_a_step": round(float(np.mean(batch_sizes)), 1),
        "preemptions": sum(r.preemptions for r in requests), "graphs": graphs, "capture_s": round(capture_s, 2)}


def agreement(model, prompts, budgets, served, n=8):
    compared = mismatched = 0
    for p, bud, got in list(zip(prompts, budgets, served))[:n]:
        ids = torch.tensor([p], device="cuda")
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=bud, min_new_tokens=bud,
                             do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        expected = out.sequences[0, len(p):].tolist()
        for t, scores in enumerate(out.scores):
            top2 = scores[0].float().topk(2).values
            if top2[0] - top2[1] < TIE:
                break
            compared += 1
            if got[t] != expected[t]:
                mismatched += 1
                break
    return {"requests": n, "tokens_compared": compared, "mismatches": mismatched}


def main(out):
    model, prompts, budgets = model_and_requests()
    total = sum(budgets)
    rows = []
    with torch.no_grad():
        model.generate(torch.tensor([[1, 2, 3]], device="cuda"), max_new_tokens=4, do_sample=False, pad_token_id=0)
        served, wall, stats = serve(model, prompts, budgets, cuda_graphs=True)
        rows.append({"impl": "engine", "seconds": round(wall, 3), "tokens_per_s": round(total / wall, 1), **stats})
        check = agreement(model, prompts, budgets, served)
        _, wall, stats = serve(model, prompts, budgets, cuda_graphs=False)
        rows.append({"impl": "engine (no graphs)", "seconds": round(wall, 3), "tokens_per_s": round(total / wall, 1), **stats})
        for bs in (64, 128, 256):
            _, wall, ratio = hf_generate(model, prompts, budgets, bs)
            rows.append({"impl": f"hf generate bs={bs}", "seconds": round(wall, 3), "tokens_per_s": round(total / wall, 1),
                         "used_over_reserved_mean": round(ratio, 4)})
        for r in rows:
            print(r, flush=True)
    result = {"provenance": provenance(), "requests": N_REQUESTS, "generated_tokens": total,
              "prompt_tokens": sum(map(len, prompts)), "block_size": BLOCK, "num_blocks": NUM_BLOCKS,
              "max_batch": MAX_BATCH, "agreement": check, "rows": rows}
    print(json.dumps(check))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "paged_engine.json")
