"""Page merging and content-addressed shared loading (the lead's version of this file wins at merge)."""
