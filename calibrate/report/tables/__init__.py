"""The terminal's tables: tiers, columns, cells and comparisons (rich, the only importer)."""
