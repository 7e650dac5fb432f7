"""Chunked token logprobs / entropy: same values and gradients as the full-vocabulary form, bounded saved memory."""

from __future__ import annotations

import pytest
import torch

from sao.trainer.algos.logprobs import token_logprobs

B, T, H, V = 2, 9, 16, 50


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.5).to(dtype).requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    return hidden, weight, ids


def naive(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    allowed: torch.Tensor | None = None,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's former ``_logp``, written out over full ``[B, T, V]`` logits (the reference)."""
    logits = (hidden @ weight.T)[:, :-1].float()
    target = ids[:, 1:]
    if allowed is not None:
        logits = logits.index_select(-1, allowed)
        lookup = torch.zeros(V, dtype=torch.long)
        lookup[allowed] = torch.arange(allowed.numel())
        target = lookup[target]
    logp_all = torch.log_softmax(logits / temperature, -1)
    logp = torch.zeros(ids.shape)
    logp[:, 1:] = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    lp = logp_all if entropy_grad else logp_all.detach()
    probs = lp.exp()
    ent = torch.zeros_like(logp)
    ent[:, 1:] = -(probs * torch.where(probs > 0, lp, 0.0)).sum(-1)
    return logp, ent


def _grads(
    logp: torch.Tensor, ent: torch.Tensor | None, hidden: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    c1, c2 = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
    loss = (c1 * logp).sum() + ((c2 * ent).sum() if ent is not None else 0.0)
    gh, gw = torch.autograd.grad(loss, [hidden, weight])
    return gh.float(), gw.float()


ALLOWED = torch.tensor([3, 17, 4, 40, 0, 22])
CASES = [
    pytest.param(1.0, None, id="plain"),
    pytest.param(0.7, None, id="temperature"),
    pytest.param(1.0, ALLOWED, id="restricted-vocab"),
    pytest.param(1.3, ALLOWED, id="restricted+temperature"),
]


@pytest.mark.parametrize("chunk", [1, 5, 1024, None])
@pytest.mark.parametrize(("temperature", "allowed"), CASES)
def test_fp32_values_and_gradients_match_the_full_vocabulary_form(
    chunk: int | None, temperature: float, allowed: torch.Tensor | None
) -> None:
    hidden, weight, ids = _inputs(torch.float32)
    if allowed is not None:
        ids[:, ::2] = allowed[ids[:, ::2] % allowed.numel()]  # a mix of allowed and outside targets
    ref_lp, ref_ent = naive(hidden, weight, ids, temperature, allowed)
    lp, ent = token_logprobs(
        hidden, lambda h: h @ weight.T, ids, temperature=temperature, allowed=allowed, with_entropy=True,
        entropy_grad=True, chunk_tokens=chunk,
    )  # fmt: skip
    assert ent is not None and lp.dtype == torch.float32 and lp.shape == (B, T)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-6)
    assert float(lp[:, 0].detach().abs().sum()) == 0.0 and float(ent[:, 0].detach().abs().sum()) == 0.0
    for got, want in zip(_grads(lp, ent, hidden, weight), _grads(ref_lp, ref_ent, hidden, weight), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("temperature", "allowed"), CASES)
def test_bf16_values_and_gradients_match_the_full_vocabulary_form(
    temperature: float, allowed: torch.Tensor | None
) -> None:
    hidden, weight, ids = _inputs(torch.bfloat16, seed=1)
    ref_lp, ref_ent = naive(hidden, weight, ids, temperature, allowed)
    lp, ent = token_logprobs(
        hidden, lambda h: h @ weight.T, ids, temperature=temperature, allowed=allowed, with_entropy=True,
        entropy_grad=True, chunk_tokens=3,
    )  # fmt: skip
    assert ent is not None and lp.dtype == torch.float32
    # bf16 logits round to ~3 significant digits; a different matmul blocking may round a few differently.
    torch.testing.assert_close(lp, ref_lp, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ent, ref_ent, rtol=2e-2, atol=2e-2)
    got_h, got_w = _grads(lp, ent, hidden, weight)
    want_h, want_w = _grads(ref_lp, ref_ent, hidden, weight)
    assert got_h.dtype == torch.float32  # compared in fp32; both were bf16 gradients
    torch.testing.assert_close(got_h, want_h, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got_w, want_w, rtol=3e-2, atol=3e-2)
    # Far from the bf16 rounding: the cosine of the gradient directions.
    for a, b in ((got_h, want_h), (got_w, want_w)):
        assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)) > 0.999


def test_detached_entropy_carries_no_gradient_and_logp_gradient_is_unchanged() -> None:
    hidden, weight, ids = _inputs(torch.float32)
    lp, ent = token_logprobs(hidden, lambda h: h @ weight.T, ids, with_entropy=True, chunk_tokens=4)
    assert ent is not None and not ent.requires_grad
    ref_lp, ref_ent = naive(hidden, weight, ids, entropy_grad=False)
    torch.testing.assert_close(ent, ref_ent)
    for got, want in zip(_grads(lp, None, hidden, weight), _grads(ref_lp, None, hidden, weight), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_positions_compute_only_the_selected_tokens() -> None:
    hidden, weight, ids = _inputs(torch.float32)
    positions = torch.rand(B, T, generator=torch.Generator().manual_seed(3)) < 0.5
    positions[0, 0] = True  # t = 0 has no prediction: stays 0 even when selected
    calls: list[int] = []

    def project(h: torch.Tensor) -> torch.Tensor:
        calls.append(h.shape[0])
        return h @ weight.T

    lp, ent = token_logprobs(hidden, project, ids, with_entropy=True, entropy_grad=True, chunk_tokens=2,
                             positions=positions)  # fmt: skip
    assert ent is not None
    ref_lp, ref_ent = naive(hidden, weight, ids)
    keep = positions.clone()
    keep[:, 0] = False
    torch.testing.assert_close(lp, torch.where(keep, ref_lp, 0.0))
    torch.testing.assert_close(ent, torch.where(keep, ref_ent, 0.0))
    assert sum(calls) == int(keep.sum())  # forward only: no row outside the selection was projected
    got = _grads(lp * keep, ent * keep, hidden, weight)
    want = _grads(ref_lp * keep, ref_ent * keep, hidden, weight)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_selected_position_gives_zeros_a_loss_can_still_backpropagate() -> None:
    hidden, weight, ids = _inputs(torch.float32)
    lp, ent = token_logprobs(hidden, lambda h: h @ weight.T, ids, with_entropy=True, entropy_grad=True,
                             positions=torch.zeros(B, T, dtype=torch.bool))  # fmt: skip
    assert ent is not None and float(lp.detach().abs().sum()) == 0.0 and float(ent.detach().abs().sum()) == 0.0
    (lp.sum() + ent.sum()).backward()
    assert hidden.grad is not None and float(hidden.grad.abs().sum()) == 0.0


def test_restricted_vocabulary_is_the_distribution_with_the_rest_masked() -> None:
    hidden, weight, ids = _inputs(torch.float32)
    ids[:] = ALLOWED[ids % ALLOWED.numel()]
    lp, ent = token_logprobs(hidden, lambda h: h @ weight.T, ids, allowed=ALLOWED, with_entropy=True, chunk_tokens=3)
    masked = torch.full((V,), float("-inf"))
    masked[ALLOWED] = 0.0
    logp_all = torch.log_softmax((hidden @ weight.T)[:, :-1] + masked, -1)
    torch.testing.assert_close(lp[:, 1:], logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1))
    p = logp_all.exp()
    assert ent is not None
    torch.testing.assert_close(ent[:, 1:], -(p * torch.where(p > 0, logp_all, 0.0)).sum(-1))


def _saved_bytes(fn: object) -> int:
    total = 0

    def pack(x: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += x.numel() * x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn()  # type: ignore[operator]
    return total


def test_chunked_form_keeps_no_vocabulary_sized_tensor_for_backward() -> None:
    # Long enough that B * T * V dominates everything else.
    b, t, h, v = 2, 256, 16, 1000
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(b, t, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    ids = torch.randint(0, v, (b, t), generator=g)
    full = b * (t - 1) * v * 4

    def run(chunk: int | None) -> None:
        lp, ent = token_logprobs(hidden, lambda x: x @ weight.T, ids, with_entropy=True, entropy_grad=True,
                                 chunk_tokens=chunk)  # fmt: skip
        assert ent is not None
        (lp.sum() + ent.sum()).backward()

    naive_saved, chunked_saved = _saved_bytes(lambda: run(None)), _saved_bytes(lambda: run(32))
    assert naive_saved >= 2 * full  # logits, log-softmax, probabilities...
    assert chunked_saved < full / 20  # the hidden states and a few floats per token


def test_no_grad_and_short_inputs() -> None:
    hidden, weight, ids = _inputs(torch.float32)
    with torch.no_grad():
        lp, ent = token_logprobs(hidden, lambda h: h @ weight.T, ids, chunk_tokens=4)
    assert ent is None and not lp.requires_grad
    torch.testing.assert_close(lp, naive(hidden, weight, ids)[0].detach())
    one, _ = token_logprobs(hidden[:, :1], lambda h: h @ weight.T, ids[:, :1])
    assert one.shape == (B, 1) and float(one.detach().abs().sum()) == 0.0


def test_tiny_hf_model_hidden_states_give_the_model_logits() -> None:
    from sao.core.tiny_models import build_tiny_model

    model = build_tiny_model("llama", seed=0, vocab_size=V)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, output_hidden_states=True)
    want = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp, _ = token_logprobs(out.hidden_states[-1], model.lm_head, ids, chunk_tokens=4)
    torch.testing.assert_close(lp[:, 1:], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"chunk_tokens": 0}, "chunk_tokens must be >= 1"),
        ({"allowed": torch.tensor([1, V])}, "outside the vocabulary"),
        ({"allowed": torch.tensor([], dtype=torch.long)}, "non-empty 1-D"),
        ({"positions": torch.ones(B, T + 1, dtype=torch.bool)}, "positions must be"),
    ],
)
def test_bad_input_is_refused_with_the_fix(kwargs: dict[str, object], match: str) -> None:
    hidden, weight, ids = _inputs(torch.float32)
    with pytest.raises(ValueError, match=match):
        token_logprobs(hidden, lambda h: h @ weight.T, ids, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"hidden must be \[B, T, H\]"):
        token_logprobs(hidden[0], lambda h: h @ weight.T, ids)
