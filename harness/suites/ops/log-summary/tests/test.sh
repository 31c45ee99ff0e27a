#!/bin/bash
# Harbor verifier: writes /logs/verifier/reward.txt (1 or 0) and a CTRF report.
mkdir -p /logs/verifier
python3 /tests/check.py
