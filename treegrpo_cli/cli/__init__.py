"""The command line: one thin module per command that parses options, calls the library and renders progress."""
