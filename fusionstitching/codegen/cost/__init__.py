"""A stitched kernel as the cost model sees it (paper 4.3): instructions, registers, a profile."""
