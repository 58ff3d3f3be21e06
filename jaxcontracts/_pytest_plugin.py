"""pytest plugin (placeholder until the plugin lands in this session)."""
