"""The base of every config section: unknown keys refused, assignments validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

ENV_PREFIX = "EDGE_VISION_"
ENV_CONFIG_FILE = "EDGE_VISION_CONFIG"
#: The token secret's default variable (AuthConfig.token_secret_env): not a config key.
ENV_TOKEN_SECRET = "EDGE_VISION_TOKEN_SECRET"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
