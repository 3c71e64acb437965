"""Templates: a kernel request -> a tile-level Program (before any pass)."""
