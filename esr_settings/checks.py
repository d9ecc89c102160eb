"""Checks several sections share."""

from __future__ import annotations

import re

from esr_settings.errors import SettingError

_HEADER_SAFE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,128}$")


def require(ok: bool, key: str, message: str) -> None:
    """A section's check: raises SettingError for `key` unless `ok`."""
    if not ok:
        raise SettingError(key, message)


def header_safe(value: str, key: str) -> None:
    """Route names and models become header values; only a safe alphabet may reach Envoy."""
    require(bool(_HEADER_SAFE.match(value)), key, f"{value!r} must match {_HEADER_SAFE.pattern}")
