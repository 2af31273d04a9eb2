"""Rejection sampling of a draft model's tokens: the target's distribution, exactly.

Draft token t at some position was drawn from the draft model's distribution q there;
the target's is p. The token is accepted with probability min(1, p(t) / q(t)); the
first one rejected is replaced by a draw from the residual max(0, p - q), renormalised,
and the rest are dropped; with every draft accepted, the target's own draw at the
next position (from p) follows. Whatever q is, each kept token is distributed as p
given the tokens before it (Leviathan et al., 2023; Chen et al., 2023), so the output
is the target's distribution; the closer q is to p, the more drafts are accepted.

Greedy requests never come here: there a draft is accepted while it is the target's
argmax (verifier.num_kept).

Randomness (engine/worker/randomness.py): a seeded request draws each position's
accept test and residual with its seed under their own streams, so it repeats its
tokens run after run (the draft's own draws use a third stream); unseeded ones draw
under the engine's key. Unlike n-gram drafts, the tokens are not plain decoding's, and
they depend on how many drafts each step had (which a full step's budget or free
blocks can cut).
"""

from __future__ import annotations

import torch
from hetero_infer.engine.worker.randomness import ACCEPT_STREAM, RESIDUAL_STREAM, Randomness
from hetero_infer.kernels import draw_ref


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drafts: list[int],
    bonus: int,
    seed: int | None,
    first_position: int,
    randomness: Randomness,
) -> list[int]:
    """The tokens a sequence keeps from its ``drafts`` (k of them).

    target_probs [k + 1, vocab]: p at each drafted position and the one after;
    draft_probs [k, vocab]: q where each draft was drawn; bonus: the target's own draw
    from p after the last draft; first_position: the position of the first draft.
    """
    k = len(drafts)
    index = torch.arange(k, device=target_probs.device)
    chosen = torch.tensor(drafts, device=target_probs.device)
    p = target_probs[index, chosen].float().cpu()
    q = draft_probs[index, chosen].float().cpu()
    for j in range(k):
        u = randomness.uniform(seed, first_position + j, ACCEPT_STREAM)
        # u < p / q without the division (q(t) > 0: t was drawn from q).
        if u * q[j] < p[j]:
            continue
        residual = (target_probs[j].float() - draft_probs[j].float()).clamp_min(0).cpu()
        if not residual.sum() > 0:
            # p <= q everywhere means p == q, where nothing is ever rejected; rounding
            # can still get here, and p is then the residual's limit.
            residual = target_probs[j].float().cpu()
        u = randomness.uniforms([seed], [first_position + j], RESIDUAL_STREAM)
        return drafts[:j] + [int(draw_ref(residual[None], u)[0])]
    return drafts + [bonus]
