"""Two decodes compared token by token, fed the same tokens (teacher-forced).

Two free-running greedy decodes with different arithmetic on each side (the native C++ step and
the plain torch step, x rounded to int8 blocks, a bf16 cache against an fp32 one) part at the
first near-tie, on some hosts and not others, and from there compare different texts (issue 52:
llama3 int8 on an AVX-512 VNNI host, 35% of logits apart by up to 8.17). So the tests feed every
side one text (the reference's own greedy tokens), compare the logits step by step within the
tolerance their arithmetic allows, and the draws where the top-2 margin leaves no doubt.
Where a side cannot be fed (the Engine draws in its step, a chat session), its free-running
draws are compared up to the first difference, which must be a near-tie of the reference's
scores forced along the tokens both drew (assert_parted_only_at_a_near_tie).
"""

from collections.abc import Callable

import torch


def assert_same_draws(ref_logits: torch.Tensor, ref_draws: list[int], *sides: tuple[list[int], torch.Tensor],
                      at_least: float = 0.5) -> None:
    """Each side's (draws, logits (N, V)) draws equal ref_draws (drawn from ref_logits (N, V)) at
    every step where ref_logits' best leads its second by more than twice the largest difference
    of any side's logits from ref_logits: there no side's argmax can differ, and a draw that does
    is the draw's fault, not a near-tie's. At least `at_least` of the steps must be that clear, so
    that the check checks something."""
    tol = 1e-6 * max(1.0, ref_logits.abs().max().item())  # logits equal to the last bit: an exact tie only
    for _, logits in sides:
        assert logits.shape == ref_logits.shape, (tuple(logits.shape), tuple(ref_logits.shape))
        tol = max(tol, (logits - ref_logits).abs().max().item())
    top2 = ref_logits.topk(2, dim=-1).values  # (N, 2)
    clear = (top2[:, 0] - top2[:, 1] > 2 * tol).tolist()
    for draws, _ in sides:
        apart = [(i, a, b) for i, (a, b, c) in enumerate(zip(draws, ref_draws, clear, strict=True)) if c and a != b]
        assert not apart, f"draws differ where the margin is clear of {2 * tol:.3g} (step, got, want): {apart}"
    assert sum(clear) >= at_least * len(clear), f"only {sum(clear)} of {len(clear)} steps are clear of {2 * tol:.3g}"


@torch.no_grad()
def eager_logits(model, prompt: torch.Tensor, feed: list[int], prefill: bool = False) -> torch.Tensor:
    """generate()'s steps, teacher-forced: prefill prompt (1, T) into a KVCache of the length
    generate(model, prompt, len(feed) + 1) holds, then one step per id of feed; returns the logits
    (len(feed), V) of those steps, whose argmax is generate()'s draw after that id (prefill: the
    prefill's row first, whose argmax is its first draw: (1 + len(feed), V))."""
    from tinyllm.kv_cache import KVCache

    cache = KVCache(model.cfg.n_layers, 1, prompt.shape[1] + len(feed) + 1, model.device)
    cache.reset(None)
    first = model(prompt, cache=cache, last_only=True)[0][0, -1]
    rows = [model(torch.tensor([[t]]), cache=cache)[0][0, -1] for t in feed]
    return torch.stack([first, *rows] if prefill else rows)  # (N, V)


def parted_at(got: list[int], want: list[int]) -> int | None:
    """The first draw at which two free-running decodes differ (one ending while the other goes
    on counts), or None where they are equal."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):  # lengths: below
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def assert_parted_only_at_a_near_tie(got: list[int], want: list[int],
                                     scores_at: Callable[[int], tuple[torch.Tensor, float]], what: object = "") -> None:
    """For a side that draws its own tokens and cannot be fed (the continuous Engine samples in
    its step; a chat session): its draws `got` equal the reference's free-running `want` up to
    their first difference k, and at k the two part at a near-tie: scores_at(k) gives the
    reference's scores (V,) for draw k, forced along want[:k] (the tokens both drew; argmax is
    its draw), and the tolerance their arithmetic allows; its best leads neither got[k] nor
    want[k] by more than twice that. After k the two read different texts: nothing more is
    compared. Equal sequences pass without a forward."""
    k = parted_at(got, want)
    if k is None:
        return
    assert k < len(got) and k < len(want), f"{what}: equal for {k} draws, then one ended and the other went on"
    scores, tol = scores_at(k)
    best = scores.max().item()
    lead = max(best - scores[got[k]].item(), best - scores[want[k]].item())
    assert lead <= 2 * tol, (f"{what}: parted at draw {k} (got {got[k]}, want {want[k]}) where the reference's best "
                             f"leads by {lead:.3g}, more than twice the tolerance {tol:.3g}: not a near-tie")


@torch.no_grad()
def greedy_scores(model, prompt: list[int], feed: list[int], rtol: float, repeat_penalty: float = 1.0,
                  ) -> tuple[torch.Tensor, float]:
    """generate()'s greedy scores (V,) for the draw after prompt + feed (one forward over the
    whole text, penalized over all of it as generate() does), and rtol of the largest of them
    (at least rtol): the tolerance for assert_parted_only_at_a_near_tie."""
    from tinyllm.decode.sampling import apply_repeat_penalty

    ctx = torch.tensor([[*prompt, *feed]], device=model.device)  # (1, T)
    logits = model(ctx)[0][:, -1].float()  # (1, V)
    if repeat_penalty != 1.0:
        logits = apply_repeat_penalty(logits, ctx, repeat_penalty)
    return logits[0], rtol * max(1.0, logits.abs().max().item())


def assert_replies_part_only_at_a_near_tie(got, want, rtol: float = 1e-4, what: object = "") -> None:
    """Two chat sessions' last greedy replies, each drawn by its own session (a session cannot be
    fed another text): got's reply ids are want's up to their first difference, and there the two
    part at a near-tie of want's model's logits over want's context before the reply and the ids
    both drew (greedy_scores; ids from the decoder's n_valid on are never drawn)."""
    got_ids, want_ids = list(got.messages[-1].ids), list(want.messages[-1].ids)
    if got_ids == want_ids:
        return
    ctx = list(want.context)
    start = next(i for i in range(len(ctx) - len(want_ids), -1, -1) if ctx[i:i + len(want_ids)] == want_ids)
    n_valid = getattr(want.decoder, "n_valid", None)

    def scores_at(k: int) -> tuple[torch.Tensor, float]:
        scores, tol = greedy_scores(want.model, ctx[:start], want_ids[:k], rtol)
        if n_valid is not None:
            scores[n_valid:] = float("-inf")
        return scores, tol

    assert_parted_only_at_a_near_tie(got_ids, want_ids, scores_at, what)
