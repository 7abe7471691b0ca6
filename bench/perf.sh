#!/usr/bin/env bash
# softefa perf with its defaults beside raw UDP and TCP, in interleaved rounds: in each round
# bench's 2proc figures of udp, udp-1pkt and tcp (rate-64B, bw-8KiB, pingpong-64B, one run),
# then softefa perf send_bw -s 64 -D 3, send_bw -D 3 (8 KiB) and send_lat -s 64 -n 20000, each a
# server and a client process. Prints every round, then the medians and the ratios issue #32's
# targets name. perf's latencies are half round trips, as perftest's; the ratios double them to
# compare with the bench's round trips. docs/performance.md, "softefa perf with its defaults
# beside raw UDP and TCP", holds the latest table.
#
#   bench/perf.sh [ROUNDS]        default 3
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/softefa" ./cmd/softefa
(cd bench && go build -o "$work/bench" .)
port=$((21500 + RANDOM % 400))

# perfrun TEST ARGS...: one server and one client process; prints the client's result line and
# its retransmission counters (--stats).
perfrun() {
	local test=$1
	shift
	port=$((port + 1))
	"$work/softefa" perf "$test" --server --listen "127.0.0.1:$port" >/dev/null 2>&1 &
	local srv=$!
	local out
	for _ in $(seq 50); do
		out=$("$work/softefa" perf "$test" --connect "127.0.0.1:$port" --stats "$@" 2>&1) && break
		sleep 0.1 # (the server is not listening yet)
	done
	wait "$srv" || true
	echo "$out" | awk '/#bytes/ {getline; printf "%s", $0}
		$1 == "retrans_pkts" {printf " retrans %s", $2}
		$1 == "retrans_timeout_events" {printf " timeouts %s", $2}
		$1 == "sparse_copies" {printf " sparse %s", $2}'
	echo
}

for r in $(seq "$rounds"); do
	echo "== round $r"
	"$work/bench" --runs 1 --modes 2proc --workloads rate-64B,bw-8KiB,pingpong-64B --only udp,udp-1pkt,tcp 2>&1 |
		awk '$2 == "2proc" && ($3 == "rate" || $3 == "goodput" || $3 ~ /^p99/) {print "bench", $1, $4, $3, $5}' |
		tee -a "$work/bench.txt"
	echo "perf rate64 $(perfrun send_bw -s 64 -D 3)" | tee -a "$work/perf.txt"
	echo "perf bw8k $(perfrun send_bw -D 3)" | tee -a "$work/perf.txt"
	echo "perf lat64 $(perfrun send_lat -s 64 -n 20000)" | tee -a "$work/perf.txt"
done

# med FILE PATTERN FIELD: the median of FIELD over FILE's lines matching PATTERN.
med() {
	grep -E "$2" "$1" | awk -v f="$3" '{print $f}' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
udp1=$(med "$work/bench.txt" '^bench rate-64B udp-1pkt rate' 5)
tcp=$(med "$work/bench.txt" '^bench bw-8KiB tcp goodput' 5)
udp99=$(med "$work/bench.txt" '^bench pingpong-64B udp p99 ' 5)
rate=$(med "$work/perf.txt" '^perf rate64' 7)
bw=$(med "$work/perf.txt" '^perf bw8k' 6)
p99=$(med "$work/perf.txt" '^perf lat64' 10)
p999=$(med "$work/perf.txt" '^perf lat64' 11)
max=$(med "$work/perf.txt" '^perf lat64' 6)
top=$(grep -E '^perf lat64' "$work/perf.txt" | awk '{print $6}' | sort -g | tail -1)
echo "== medians of $rounds rounds"
awk -v rate="$rate" -v udp1="$udp1" -v bw="$bw" -v tcp="$tcp" -v p99="$p99" -v udp99="$udp99" -v p999="$p999" -v max="$max" -v top="$top" 'BEGIN {
	printf "64 B rate          perf %s Mmsg/s, udp-1pkt %s: %.2fx (target >= 5x)\n", rate, udp1, rate / udp1
	printf "8 KiB bandwidth    perf %s Gb/s, TCP %s: %.2fx (target >= 1.0x)\n", bw, tcp, bw / tcp
	printf "64 B round trip    perf p99 %.1f us, raw UDP %s: %.2fx (target <= 1.3x)\n", 2 * p99, udp99, 2 * p99 / udp99
	printf "p99.9 / p99        %.2f (target <= 3)\n", p999 / p99
	printf "maximum            %s us (the largest of the rounds %s), half a round trip (target: no sample at the 2 ms timer)\n", max, top
}'
