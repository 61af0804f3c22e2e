"""The `trainflow` commands, one module each: `add(sub)` adds its arguments (its subparser), `run(args)` does it and
returns its summary (None: nothing to summarize), `render(summary)` is the summary as a person reads it (absent: the
JSON); `parsed(parser, args)`, where a command has one, checks its arguments once parsed. flows/cli/app.py lists
them; a new command is one module here and one entry in that list."""
