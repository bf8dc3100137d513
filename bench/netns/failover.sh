#!/usr/bin/env bash
# Subnet router failover, measured: the end-to-end test cli/tests/e2e_ha.rs (two routers
# granted one subnet, a LAN host without a route back, a member pinging it every 200 ms)
# with the primary killed and restarted ROUNDS times (default 10); prints each round's
# longest time without an answer and their median. Its topology lives in namespaces
# the test makes and removes; it stops by itself (each round is bounded by the test's
# waits, 45 s at most).
#
#   sudo bench/netns/failover.sh            # ROUNDS=10
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${ROUNDS:-10}
cd "$ROOT"
WEFT_HA_ROUNDS=$ROUNDS timeout $((60 + ROUNDS * 45)) \
    cargo test -q -p weft --test e2e_ha a_subnet_keeps_answering -- --nocapture 2>&1 | grep -E '^failover'
