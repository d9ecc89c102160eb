"""Settings as validated frozen dataclasses: built from parsed YAML with errors that name the bad
key, and written back (`dump` is `build`'s inverse). Every room declares its own section with these;
this room imports none of them."""

from esr_settings.checks import header_safe, require
from esr_settings.errors import ConfigError, SettingError
from esr_settings.schema import build, dump, replace_at

__all__ = ["ConfigError", "SettingError", "build", "dump", "header_safe", "replace_at", "require"]
