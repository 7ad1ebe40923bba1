"""Running programs (or eager models): the decode loops, the program loader, the engine."""
