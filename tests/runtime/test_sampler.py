"""The sampler's fast paths against plain references: the top-k/top-p cut found from leading candidates
keeps exactly what a full sort keeps, and draws follow the processed distribution."""
import pytest
import torch

from runtime.sampling import sampler
from runtime.sampling.sampler import SamplingRow, _leading_groups, processed_probs, sample
from runtime.sampling.verify import inverse_cdf
from runtime.sampling_params import SamplingParams


def full_sort_cut(probs, top_k, top_p):
    """The textbook cut: sort everything, keep rank < k while the mass before a token is below p."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[1]).unsqueeze(0)
    keep = (rank < top_k.unsqueeze(1)) & ((sorted_p.cumsum(-1) - sorted_p) < top_p.unsqueeze(1))
    return torch.zeros_like(probs).scatter_(1, idx, sorted_p * keep)


def logits_of_rising_entropy(vocab=500, seed=0):
    """Rows from peaked (settled by 8 candidates) through medium (64) to flat (a full sort)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, vocab, generator=g) * torch.tensor([[12.0], [2.5], [0.1]])


@pytest.fixture
def small_tiers(monkeypatch):
    monkeypatch.setattr(sampler, "TRUNCATION_CANDIDATES", (8, 64))


def test_each_tier_settles_the_rows_it_should_and_keeps_what_a_full_sort_keeps(small_tiers):
    probs = torch.softmax(logits_of_rising_entropy(), -1)
    k, p = torch.tensor([500, 500, 500]), torch.tensor([0.9, 0.9, 0.9])
    groups = list(_leading_groups(probs, k, p))
    assert [g[0].tolist() for g in groups] == [[0], [1], [2]]
    assert [g[1].shape[1] for g in groups] == [8, 64, 500]
    got = torch.zeros_like(probs)
    for rows, lead_p, lead_ids, keep in groups:
        got[rows] = torch.zeros(len(rows), 500).scatter_(1, lead_ids, lead_p * keep)
    assert torch.equal(got, full_sort_cut(probs, k, p))


@pytest.mark.parametrize("params", [dict(top_p=0.9), dict(top_k=5), dict(top_k=100, top_p=0.8),
                                    dict(top_p=0.95, min_p=0.02), dict(top_k=3, temperature=0.5)])
def test_processed_probs_match_the_full_sort_reference(small_tiers, params):
    logits = logits_of_rising_entropy(seed=1)
    rows = [SamplingRow(SamplingParams(**params)) for _ in range(3)]
    p = SamplingParams(**params)
    probs = torch.softmax(logits / p.temperature, -1)
    want = full_sort_cut(probs, torch.full((3,), p.top_k or 500), torch.full((3,), p.top_p))
    if p.min_p:
        want = torch.where(probs >= p.min_p * probs.max(-1, keepdim=True).values, want, 0.0)
    torch.testing.assert_close(processed_probs(logits, rows), want / want.sum(-1, keepdim=True), rtol=1e-6, atol=0)


@pytest.mark.parametrize("params", [dict(), dict(top_p=0.9), dict(top_k=4, top_p=0.95), dict(top_p=0.9, min_p=0.1)])
def test_sampled_frequencies_follow_the_processed_distribution(small_tiers, params):
    from scipy.stats import chisquare

    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(2)) * 1.5
    p = SamplingParams(temperature=0.8, **params)
    want = processed_probs(logits, [SamplingRow(p)])[0]
    rows = [SamplingRow(p, generator=torch.Generator().manual_seed(i)) for i in range(2000)]
    counts = torch.zeros(40)
    for _ in range(5):
        counts += torch.bincount(torch.tensor(sample(logits.expand(2000, -1), rows).token_ids), minlength=40)
    assert counts[want == 0].sum() == 0  # nothing outside the cut, ever
    live = want > 0
    assert chisquare(counts[live].numpy(), (want[live] * counts.sum()).numpy()).pvalue > 1e-3


def test_inverse_cdf_never_lands_on_a_token_without_mass():
    w = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    assert inverse_cdf(w, torch.tensor([0.0, 0.0])).tolist() == [1, 2]
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    assert inverse_cdf(w, torch.stack([below_one, below_one])).tolist() == [2, 2]
    # a total rounding past the cumulative sum's last step still picks the last token with mass
    assert inverse_cdf(w, torch.tensor([1.0, 1.0])).tolist() == [2, 2]


def test_seeded_rows_draw_the_same_token_whatever_their_batch_mates():
    logits = logits_of_rising_entropy(vocab=300, seed=3)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    alone = [sample(logits[i:i + 1], [SamplingRow(p, generator=torch.Generator().manual_seed(i))]).token_ids[0]
             for i in range(3)]
    mixed = [SamplingRow(p, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    mixed[1] = SamplingRow(SamplingParams(temperature=0))  # a greedy mate in the middle
    together = sample(logits, mixed).token_ids
    assert together[0] == alone[0] and together[2] == alone[2]
    assert together[1] == int(logits[1].argmax())


def test_greedy_rows_take_argmaxs_token_ties_and_nans_included():
    """The greedy paths read max's indices (faster than argmax on the CPU): the first maximum of a row, a NaN
    counting as one, exactly as argmax picks it, alone and beside sampled rows."""
    logits = torch.randn(6, 300)
    logits[1, [7, 40, 299]] = 9.0  # a tie: the first wins
    logits[2, [5, 9]] = float("nan")  # NaNs: the first one, as argmax
    logits[3] = float("-inf")
    logits[4, :2] = torch.tensor([0.0, -0.0])
    logits[4, 2:] = -1.0
    want = logits.argmax(-1).tolist()
    assert want[1:5] == [7, 5, 0, 0]
    assert sample(logits, [SamplingRow(SamplingParams(temperature=0))] * 6).token_ids == want
    mixed = [SamplingRow(SamplingParams(temperature=0))] * 5 + [SamplingRow(SamplingParams(temperature=1.0, seed=3))]
    assert sample(logits, mixed).token_ids[:5] == want[:5]
