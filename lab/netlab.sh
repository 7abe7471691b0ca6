#!/usr/bin/env bash
# The network lab: two network namespaces joined by two veth paths, with the kernel's ECMP
# hashing UDP ports across them, an nftables random drop, a TBF bottleneck on one path, and that
# path going down in the middle of the run. softefa runs across it: an RDMA write bandwidth test
# and a pingpong that checks every message. Needs root (namespaces, tc, nft); without it, it says
# so and exits 0.
#
#   bash lab/netlab.sh            # builds softefa, runs, checks, tears down
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "netlab: skipped: needs root for network namespaces"
  exit 0
fi
for tool in ip tc nft; do
  if ! command -v "$tool" >/dev/null; then
    echo "netlab: skipped: $tool is not installed"
    exit 0
  fi
done

A=sfa-lab-a-$$ B=sfa-lab-b-$$
BIN=$(mktemp -d)/softefa
cleanup() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$(dirname "$BIN")"
}
trap cleanup EXIT
go build -o "$BIN" ./cmd/softefa

ip netns add "$A"
ip netns add "$B"
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv4.fib_multipath_hash_policy=1      # hash L4 ports
  ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.ignore_routes_with_linkdown=1
done
# Two paths: veth pairs a1-b1 (10.10.1.0/24) and a2-b2 (10.10.2.0/24).
for i in 1 2; do
  ip link add "a$i" netns "$A" type veth peer name "b$i" netns "$B"
  ip -n "$A" addr add "10.10.$i.1/24" dev "a$i"
  ip -n "$B" addr add "10.10.$i.2/24" dev "b$i"
  ip -n "$A" link set "a$i" up
  ip -n "$B" link set "b$i" up
done
# Each device lives on an address of its own, reached over both paths (ECMP).
ip -n "$A" addr add 10.20.0.1/32 dev lo
ip -n "$B" addr add 10.20.0.2/32 dev lo
ip -n "$A" route add 10.20.0.2/32 src 10.20.0.1 nexthop via 10.10.1.2 dev a1 weight 1 nexthop via 10.10.2.2 dev a2 weight 1
ip -n "$B" route add 10.20.0.1/32 src 10.20.0.2 nexthop via 10.10.1.1 dev b1 weight 1 nexthop via 10.10.2.1 dev b2 weight 1
# A 100 Mbit/s bottleneck on path 1, and 1% random loss of UDP into B.
tc -n "$A" qdisc add dev a1 root tbf rate 100mbit burst 64kb latency 20ms
ip netns exec "$B" nft add table inet lab
ip netns exec "$B" nft add chain inet lab in '{ type filter hook input priority 0; }'
ip netns exec "$B" nft add rule inet lab in meta l4proto udp numgen random mod 100 '<' 1 counter drop

fail=0
run_lab() { # $1: test name, rest: client args; path 2 goes down 1 s into the run
  ip netns exec "$B" "$BIN" perf "$1" --server --listen 10.20.0.2:18515 >/dev/null 2>"$BIN.srv" &
  local srv=$!
  sleep 0.5
  (sleep 1; ip -n "$A" link set a2 down; echo "netlab: path 2 down") &
  local down=$!
  local out
  if ! out=$(ip netns exec "$A" "$BIN" perf "$@" --connect 10.20.0.2:18515 --json); then
    echo "netlab: $1 failed: $out"; cat "$BIN.srv"; fail=1
  else
    echo "netlab: $1: $out"
    case "$out" in *'"errors":0'*) ;; *) echo "netlab: $1 reported errors"; fail=1 ;; esac
  fi
  wait "$down" || true
  wait "$srv" || fail=1
  ip -n "$A" link set a2 up
  sleep 0.2
}
run_lab write_bw -s 65536 -D 3s -t 16
run_lab send_lat -s 1024 -n 20000

# pingpong checks every byte, both ways.
ip netns exec "$B" "$BIN" pingpong --server --listen 10.20.0.2:18516 -n 2000 -s 4096 >/dev/null 2>&1 &
srv=$!
sleep 0.5
if out=$(ip netns exec "$A" "$BIN" pingpong --connect 10.20.0.2:18516 -n 2000 -s 4096); then
  echo "netlab: pingpong: $(echo "$out" | tail -1)"
  case "$out" in *"4000 messages checked, 0 errors"*) ;; *) fail=1 ;; esac
else
  echo "netlab: pingpong failed: $out"; fail=1
fi
wait "$srv" || fail=1

drops=$(ip netns exec "$B" nft list chain inet lab in | grep -o 'packets [0-9]*' | head -1)
echo "netlab: nftables dropped $drops"
if [ "$fail" != 0 ]; then
  echo "netlab: FAIL"
  exit 1
fi
echo "netlab: PASS"
