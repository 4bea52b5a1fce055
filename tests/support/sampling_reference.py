"""The filtered draw of engine/sampling.py written out plainly in fp64, for the kernels that implement it."""
import torch


def plain_top_draw(row: torch.Tensor, k: int, t: float, top_p: float, min_p: float, u: float):
    """The definition in fp64: rank by probability (ties by id), keep the prefix top-k / top-p / min-p allow (the first
    always; top-p of the top-k's mass, renormalised as llama.cpp and transformers), draw in id order where the
    cumulative sum passes u times the kept total. Also how close the draw and the cut came to a boundary (rounding
    may go either way there)."""
    p = torch.softmax(row.double() / t, dim=-1)
    order = sorted(range(len(p)), key=lambda i: (-float(p[i]), i))[: k or len(p)]
    top_p = top_p * sum(float(p[i]) for i in order) if k and top_p < 1 else top_p
    kept, before, margin = [], 0.0, 1.0
    for j, i in enumerate(order):
        pi = float(p[i])
        if j and ((top_p < 1 and before >= top_p) or pi < min_p * float(p[order[0]])):
            break
        margin = min(margin, abs(before - top_p) if top_p < 1 else 1.0, abs(pi - min_p * float(p[order[0]])) if j else 1.0)
        kept.append(i)
        before += pi
    if len(kept) < len(order):  # the first token cut: how close it came
        pi = float(p[order[len(kept)]])
        margin = min(margin, abs(before - top_p) if top_p < 1 else 1.0, abs(pi - min_p * float(p[order[0]])))
    kept.sort()
    weights = [float(p[i]) for i in kept]
    target, run = u * sum(weights), 0.0
    for i, w in zip(kept, weights):
        margin = min(margin, abs(run + w - target))
        run += w
        if run > target:
            return i, margin
    return kept[-1], margin
