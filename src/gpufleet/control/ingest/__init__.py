"""Agent batches: decode, screen and queue them for the writer's group commit, and write them."""
