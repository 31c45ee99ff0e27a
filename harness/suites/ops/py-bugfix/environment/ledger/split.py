"""Splitting an amount of money into equal shares."""


def split_cents(total: int, parts: int) -> list[int]:
    """Split ``total`` cents into ``parts`` integer shares.

    The shares must add up to ``total`` exactly, differ by at most one cent, and the
    larger shares come first. ``parts`` must be positive and ``total`` not negative
    (ValueError otherwise).
    """
    share = total // parts
    return [share] * parts
