"""Planning: which graphs answer (and run) a problem: its shape bucket's, a decode step's with its
heads as batch, or its own dense graphs. Selection says whether graphs are supported; planning says
which graphs those are. Torch-free."""
