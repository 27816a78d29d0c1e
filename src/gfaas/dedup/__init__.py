"""Page merging: opt-in hints, KSM burst control and content-addressed shared mappings."""
