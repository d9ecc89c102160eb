"""The two errors a settings section can raise."""


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong shape; the message names its key."""


class SettingError(ValueError):
    """A section's own check failed; `field` names the key, which `build` prefixes with its path."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
