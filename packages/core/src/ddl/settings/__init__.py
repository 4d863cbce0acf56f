"""Settings: the run configuration (flags, config file, site defaults merged and validated),
the site profiles, and where a run's directory lives. Imports only the contract."""
