"""Reading runs: finding runs and their files, lines (torn-line and surrogate tolerant), run
selection, tails, filters, following growing files, the writer's step rollups."""
