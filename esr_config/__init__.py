"""The config file: every room's section composed into one validated `RouterConfig`, read from
YAML and written back by one writer."""

from esr_config.files import leading_comments, load_config, load_or_exit, parse_config, write_config
from esr_config.schema import EncoderConfig, RouterConfig
from esr_settings import ConfigError

__all__ = ["ConfigError", "EncoderConfig", "RouterConfig", "leading_comments", "load_config", "load_or_exit", "parse_config", "write_config"]
