import pytest

from ledger.split import split_cents


@pytest.mark.parametrize("total,parts", [(100, 3), (1, 4), (0, 2), (999_999, 7), (10, 10), (5, 1)])
def test_shares_add_up(total, parts):
    assert sum(split_cents(total, parts)) == total


@pytest.mark.parametrize("total,parts", [(100, 3), (1, 4), (17, 5)])
def test_shares_differ_by_at_most_one_cent_larger_first(total, parts):
    shares = split_cents(total, parts)
    assert len(shares) == parts
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_exact_split():
    assert split_cents(100, 3) == [34, 33, 33]


@pytest.mark.parametrize("total,parts", [(100, 0), (100, -2), (-1, 2)])
def test_bad_arguments_raise(total, parts):
    with pytest.raises(ValueError):
        split_cents(total, parts)
