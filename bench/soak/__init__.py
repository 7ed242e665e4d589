"""The soak (issue 69): its history, its invariants."""
