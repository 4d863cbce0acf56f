"""``ddl plugins`` and ``ddl sites``: what is installed and which site profiles exist."""

from __future__ import annotations

import argparse

from ddl.contract.errors import UsageError


def cmd_plugins(ns: argparse.Namespace) -> int:
    from ddl.commands import plugin_listing
    from ddl.contract.plugins import Plugins

    print("\n".join(plugin_listing.render(Plugins())))
    return 0


def cmd_sites(ns: argparse.Namespace) -> int:
    import json

    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import aliases, get_site, known_sites, load_profile

    plugins = Plugins()
    if ns.action == "show":
        if not ns.name:
            raise UsageError("sites show: name a profile; allowed: "
                             + ", ".join(known_sites(plugins)))
        profile = get_site(ns.name, plugins)
        print(f"# {profile.source}")
        print(json.dumps(profile.model_dump(mode="json"), indent=2))
        return 0
    short = aliases(plugins)
    for name, path in known_sites(plugins).items():
        try:
            description = load_profile(path).description
        except UsageError as exc:
            description = f"INVALID: {exc}"
        also = ", ".join(a for a, p in short.items() if p == name)
        print(f"  {name:<16} {also or '-':<8} {description}  [{path}]")
    return 0
