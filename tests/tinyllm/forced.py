"""Two decodes compared token by token, fed the same tokens (teacher-forced).

Two free-running greedy decodes with different arithmetic on each side (the native C++ step and
the plain torch step, x rounded to int8 blocks, a bf16 cache against an fp32 one) part at the
first near-tie, on some hosts and not others, and from there compare different texts (issue 52:
llama3 int8 on an AVX-512 VNNI host, 35% of logits apart by up to 8.17). So the tests feed every
side one text (the reference's own greedy tokens), compare the logits step by step within the
tolerance their arithmetic allows, and the draws where the top-2 margin leaves no doubt.
"""

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
def eager_logits(model, prompt: torch.Tensor, feed: list[int]) -> torch.Tensor:
    """generate()'s steps, teacher-forced: prefill prompt (1, T) into a KVCache of the length
    generate(model, prompt, len(feed) + 1) holds, then one step per id of feed; returns the logits
    (len(feed), V) of those steps, whose argmax is generate()'s draw after that id."""
    from tinyllm.kv_cache import KVCache

    cache = KVCache(model.cfg.n_layers, 1, prompt.shape[1] + len(feed) + 1, model.device)
    cache.reset(None)
    model(prompt, cache=cache, last_only=True)
    return torch.stack([model(torch.tensor([[t]]), cache=cache)[0][0, -1] for t in feed])  # (N, V)
