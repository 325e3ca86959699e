"""Recording, replaying and exporting engine traces."""
