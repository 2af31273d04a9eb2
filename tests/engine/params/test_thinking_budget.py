"""ThinkingBudget: which token a step must take once a thinking section spends its
budget, read from the tokens alone."""

from __future__ import annotations

import pytest
from hetero_infer.engine.params.thinking_budget import ThinkingBudget
from hetero_infer.engine.settings.exceptions import ValidationError

START, END = (7, 8), (9, 10, 11)


def forced(tokens: int, token_ids: list[int]) -> int | None:
    return ThinkingBudget(tokens, START, END).forced_token(token_ids)


@pytest.mark.parametrize(
    ("tokens", "token_ids", "expected"),
    [
        (2, [1, 2, 3, 4], None),  # no thinking section
        (2, [1, 7, 8, 5], None),  # one token thought, two allowed
        (2, [1, 7, 8, 5, 6], 9),  # spent: the end mark's first token
        (2, [1, 7, 8, 5, 6, 9], 10),  # then its next
        (2, [1, 7, 8, 5, 6, 9, 10], 11),
        (2, [1, 7, 8, 5, 6, 9, 10, 11], None),  # closed
        (2, [1, 7, 8, 9, 10, 11, 3, 3], None),  # closed by the model itself
        (5, [7, 8, 5, 9, 6, 9], None),  # an end token alone is no end
        (4, [7, 8, 5, 9, 6, 9], 10),  # spent where the model began the end mark
        (2, [7, 8, 9, 10], 11),  # the model began the end mark: forcing goes on with it
        (0, [1, 7, 8], 9),  # no thinking at all
        (1, [7, 8, 9, 10, 11, 7, 8, 5], 9),  # a second section has its own budget
        (1, [7, 5, 8], None),  # the start mark's tokens apart are no start
    ],
)
def test_forced_token(tokens: int, token_ids: list[int], expected: int | None) -> None:
    assert forced(tokens, token_ids) == expected


@pytest.mark.parametrize(
    ("tokens", "start", "end"),
    [(-1, START, END), (True, START, END), (2.0, START, END), (1, (), END), (1, START, ())],
)
def test_invalid_budget(tokens: int, start: tuple[int, ...], end: tuple[int, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ThinkingBudget(tokens, start, end)
    assert info.value.param == "thinking_token_budget"
