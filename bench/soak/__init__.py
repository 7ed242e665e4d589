"""The soak (issue 69): its schedule (plan.py), its history (history.py), what it reads of the
cluster's records (observe.py), its invariants (invariants.py)."""
