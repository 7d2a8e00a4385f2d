"""Retry-After as seconds, whichever form the server sends."""

from __future__ import annotations

import email.utils
import time

import pytest

from packscope.core.retry_after import retry_after_s


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"Retry-After": "-2"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_seconds_or_nothing(headers, want):
    assert retry_after_s(headers) == want


def test_an_http_date_is_seconds_from_now():
    header = {"Retry-After": email.utils.formatdate(time.time() + 30, usegmt=True)}
    assert 28 <= retry_after_s(header) <= 30
