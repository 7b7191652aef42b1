"""The block export/import format: a round trip, and every way a stored block can be wrong refused."""
import pytest

from runtime.tiers.block_file import BlockRecord, CorruptBlock, decode, encode

FP, H, TOKENS = b"f" * 16, 12345678901234567890, tuple(range(16))


def stored(payload: bytes = b"kv" * 100) -> bytes:
    return encode(BlockRecord(FP, H, TOKENS, payload))


def test_a_block_comes_back_as_it_went():
    record = decode(bytearray(stored()), FP, H, TOKENS)
    assert bytes(record.payload) == b"kv" * 100 and record.tokens == TOKENS


@pytest.mark.parametrize("change,why", [
    (lambda d: d[:-1], "truncated"),
    (lambda d: d + b"x", "padded"),
    (lambda d: d[:10], "header"),
    (lambda d: d[:-5] + b"XXXXX", "checksum"),
    (lambda d: b"NOTAKVBL" + d[8:], "magic"),
])
def test_damaged_bytes_are_refused(change, why):
    with pytest.raises(CorruptBlock, match=why):
        decode(bytearray(change(stored())), FP, H, TOKENS)


def test_another_model_block_or_prefix_is_refused():
    with pytest.raises(CorruptBlock, match="fingerprint"):
        decode(bytearray(stored()), b"g" * 16, H, TOKENS)
    with pytest.raises(CorruptBlock, match="hash"):
        decode(bytearray(stored()), FP, H + 1, TOKENS)
    with pytest.raises(CorruptBlock, match="other tokens"):
        decode(bytearray(stored()), FP, H, (99,) + TOKENS[1:])


def test_without_the_checksum_every_other_check_still_holds():
    flipped = stored()[:-5] + b"XXXXX"  # bytes kept in this process's memory: the CRC is not rechecked
    assert bytes(decode(bytearray(flipped), FP, H, TOKENS, checksum=False).payload).endswith(b"XXXXX")
    for data, fp, h, tokens in [(stored()[:-1], FP, H, TOKENS), (stored(), b"g" * 16, H, TOKENS),
                                (stored(), FP, H + 1, TOKENS), (stored(), FP, H, (99,) + TOKENS[1:])]:
        with pytest.raises(CorruptBlock):
            decode(bytearray(data), fp, h, tokens, checksum=False)
