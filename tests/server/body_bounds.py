"""A request body's verdict on a set of fields, for the tests of each body's bounds."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError


def check_body(model: type[BaseModel], fields: dict, valid: bool) -> None:
    """``model`` takes ``fields`` if ``valid``, else refuses them."""
    if valid:
        model.model_validate(fields)
    else:
        with pytest.raises(ValidationError):
            model.model_validate(fields)
