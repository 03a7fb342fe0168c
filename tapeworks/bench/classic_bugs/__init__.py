"""Classic training bugs, written as users write them: the held-out set of `tapeworks bench bugs`.

Each file is a complete script with one bug. Its `# named-if:` line lists
the phrases (all of them, case-insensitive) that a message must contain to
count as naming the cause; the lines were written with the scripts, before
any was run against tapeworks.
"""
