"""A tiny ledger helper library."""
