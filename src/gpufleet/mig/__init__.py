"""MIG and GPU-sharing planner: valid layouts, demand, exact and first-fit packing, emitters."""
