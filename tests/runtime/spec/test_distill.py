"""The self-distillation data's packing: concatenated data sets keep each response's rows, and the held-out
split takes answers at every temperature whatever order they were generated in."""
import torch

from runtime.spec.distill import Samples


def packed(lengths: list[int], temps: list[float], first_token: int = 0) -> Samples:
    n = sum(lengths)
    tokens = torch.arange(first_token, first_token + n)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])
    return Samples(tokens[:, None].repeat(1, 4).half(), tokens, starts, torch.tensor(temps))


def responses(s: Samples) -> list[list[int]]:
    return [s.tokens[s.starts[i]:s.starts[i + 1]].tolist() for i in range(len(s.temperatures))]


def test_concat_keeps_every_response_and_its_rows():
    a, b = packed([3, 2], [0.0, 1.0]), packed([4], [0.5], first_token=100)
    both = Samples.concat([a, b])
    assert responses(both) == responses(a) + responses(b)
    assert both.temperatures.tolist() == [0.0, 1.0, 0.5]
    assert torch.equal(both.hidden[:, 0].long(), both.tokens)  # row i still the state of token i


def test_the_held_out_split_has_every_temperature():
    temps = [0.0, 1.0] * 4  # prompt-major: each prompt at both temperatures in turn
    s = packed([2] * 8, temps)
    train, held = s.split(2)
    assert sorted(held.temperatures.tolist()) == [0.0, 0.0, 1.0, 1.0]
    assert len(train.temperatures) == 4
    assert sorted(sum(responses(train) + responses(held), [])) == s.tokens.tolist()


def test_the_state_store_keeps_every_row_as_it_grows():
    from runtime.spec.distill import _Rows

    store, rows = _Rows(6), torch.randn(3000, 6).to(torch.float16)
    starts = [store.append(rows[i:i + 7]) for i in range(0, 3000, 7)]  # past the first 1024 rows, twice
    assert starts == list(range(0, 3000, 7)) and torch.equal(store.data[:store.n], rows)
