"""Selection: static rules, the selector with its caches, single flight, warmup."""
