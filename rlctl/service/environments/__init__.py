"""Environment catalog: discovery by AST, config schemas read in a child process."""
