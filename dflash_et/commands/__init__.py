"""The `dflash` commands, one module each: `add` puts its parser (help that says what it does and what it costs)
on `dflash`'s, and `run` calls the library."""
