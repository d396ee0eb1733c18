"""Fleet power orders: the spec of an order and the operations that apply, revert and report it."""
