#!/bin/bash
# Harbor verifier: the hidden tests, with a CTRF report; reward 1 when every test passes.
mkdir -p /logs/verifier
cd /tests
PYTHONPATH=/app python3 -m pytest -q -p no:cacheprovider --ctrf /logs/verifier/ctrf.json test_split.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
