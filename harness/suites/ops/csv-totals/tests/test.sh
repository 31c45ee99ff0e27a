#!/bin/bash
# Harbor verifier: recomputes the totals from the generator (not from /app, which the agent
# could have changed) and compares; writes /logs/verifier/reward.txt.
mkdir -p /logs/verifier
python3 /tests/check.py
