"""Waiting for a state in tests: poll for it until a deadline, never sleep a guessed time.

A sleep long enough on a quiet machine is too short beside three test workers on two cores,
and needlessly long everywhere else; polling returns as soon as the state is there and fails
with what it waited for when it never comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def poll_until(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.02) -> T:
    """Call ``condition`` until it returns something true (returned), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
    return value


async def apoll_until(
    condition: Callable[[], Awaitable[T]], timeout_s: float, what: str, interval_s: float = 0.01
) -> T:
    """:func:`poll_until` inside an event loop, for a condition that is awaited (an HTTP look at a
    server, say); the loop keeps running the tasks being waited on."""
    deadline = time.monotonic() + timeout_s
    while not (value := await condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
    return value
