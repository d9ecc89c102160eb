"""An example third-party filter: adds `x-team` from the API key's prefix, or a default.

Enable it after `pip install ./examples/filter_plugin` with, in router.yaml:

    filters: [team_header, model_policy, semantic_route]
    filter_settings:
      team_header: {default_team: platform}
"""

from __future__ import annotations


class TeamHeader:
    def __init__(self, settings: dict):
        self.default_team = str(settings.get("default_team", "unknown"))

    async def __call__(self, ctx) -> None:
        auth = ctx.headers.get("authorization", "")
        key = auth.removeprefix("Bearer ").strip()
        team = key.split("-", 1)[0] if "-" in key else self.default_team
        ctx.extra_headers["x-team"] = team[:32]
