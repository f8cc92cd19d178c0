"""Programs tests run in a child process, kept as modules so they are linted and readable.

Each runs as ``python -m tests.children.<name> ARGS`` from the repository root
(``helpers.child(name, *args)`` builds the command). They import beam-prep only,
not the tests' helpers: a child has the repository root on its path, not tests/.
"""
