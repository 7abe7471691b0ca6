#!/usr/bin/env bash
# Unmodified EFA software through softefa run beside softefa's own API, two processes each, in
# interleaved rounds: libfabric 2.6's fabtests on both fabrics (efa and efa-direct; efa-direct
# has no tagged messages, and fi_pingpong fails on efa: docs/cabi.md), perftest over SRD, UCX's
# ucx_perftest over srd (UCX_TLS=srd; when cabi/thirdparty/ucx.sh has built it), and softefa perf;
# then the rows of issue #30's targets again with both processes on one host device (softefa
# device; softefa run --device), marked "(host device)". Prints every run, then the median of each
# figure over the rounds.
#
#   bench/stack.sh [ROUNDS]        default 3
#
# Needs the third-party stack (cabi/thirdparty/build.sh; SOFTEFA_STACK names its prefix, or
# build.sh --prefix finds it) and Debian's perftest. Figures: latency in µs (fabtests' usec/xfer
# and perftest's t_avg are averages of half a round trip; softefa perf's send_lat prints the
# same), bandwidth in Gb/s. docs/performance.md, "Unmodified software beside softefa perf, and on
# the host device",
# holds the latest table.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
stack=${SOFTEFA_STACK:-$(cabi/thirdparty/build.sh --prefix)}
[ -x "$stack/bin/fi_rdm_tagged_pingpong" ] || { echo "no fabtests in $stack: run cabi/thirdparty/build.sh" >&2; exit 1; }
command -v ib_send_bw >/dev/null || { echo "no perftest: apt-get install perftest" >&2; exit 1; }
command -v ss >/dev/null || { echo "no ss: apt-get install iproute2" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/softefa" ./cmd/softefa
sf=$work/softefa
LD_LIBRARY_PATH=$stack/lib "$sf" run -- true # (builds the preload shim and engine library once, before any pair)
port=21000
run=(run) # softefa run's arguments: (run --device SOCKET) for the host device's rows

# listening PORT PID: waits, up to 30 s and while process PID lives, until a TCP socket listens
# on PORT (every server here takes its client's connection there first). No fixed wait fits: a
# server's start-up ranges from milliseconds to seconds on this machine.
listening() {
  for _ in $(seq 300); do
    [ -n "$(ss -Hltn "sport = :$1")" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1 # (the server is gone)
    sleep 0.1
  done
  return 1
}

# pair NAME PARSE -- SERVER-ARGS... -- CLIENT-ARGS...: the two under softefa run, the client's
# output parsed by PARSE (a function printing one number) into $work/NAME.
pair() {
  local name=$1 parse=$2
  shift 3
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  port=$((port + 1))
  srv=("${srv[@]//@PORT@/$port}")
  cli=("${cli[@]//@PORT@/$port}")
  LD_LIBRARY_PATH=$stack/lib timeout 300 "$sf" "${run[@]}" -- "${srv[@]}" >"$work/srv.out" 2>&1 &
  local pid=$!
  listening "$port" "$pid" || true # (the client then most likely fails: the row says FAILED)
  local v=FAILED
  if LD_LIBRARY_PATH=$stack/lib timeout 120 "$sf" "${run[@]}" -- "${cli[@]}" >"$work/cli.out" 2>&1; then
    v=$($parse <"$work/cli.out") || v=FAILED
  else
    kill "$pid" 2>/dev/null || true # (a server whose client failed would wait for it)
  fi
  wait "$pid" 2>/dev/null || true
  echo "$v" >>"$work/$name"
  printf '%-34s %s\n' "$name" "$v"
}

# perf NAME PARSE ARGS...: softefa perf's two processes (no softefa run: its own API).
perf() {
  local name=$1 parse=$2
  shift 2
  port=$((port + 1))
  "$sf" perf "$@" --server --listen 127.0.0.1:$port >/dev/null 2>&1 &
  local pid=$!
  sleep 0.5
  local v=FAILED
  if timeout 120 "$sf" perf "$@" --connect 127.0.0.1:$port --json >"$work/cli.out" 2>/dev/null; then
    v=$($parse <"$work/cli.out") || v=FAILED
  fi
  wait "$pid" 2>/dev/null || true
  echo "$v" >>"$work/$name"
  printf '%-34s %s\n' "$name" "$v"
}

# Parsers. fabtests print a header ("bytes iters total time MB/sec usec/xfer Mxfers/sec", with
# more columns in fi_pingpong) and a row: the column is found by its name.
fi_col() { awk -v want="$1" '{for (i = 1; i <= NF; i++) if ($i == want) c = i} c && $1 ~ /^[0-9]/ && $c ~ /^[0-9.]+$/ {v = $c} END {if (v == "") exit 1; print v}'; }
fi_lat() { fi_col usec/xfer; }
fi_bw() { fi_col MB/sec | awk '{printf "%.2f\n", $1 * 8 / 1000}'; }
# perftest: ib_send_bw "#bytes #iterations BW peak BW average MsgRate" (MB/s: 2^20 bytes);
# ib_send_lat "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%".
pt_bw() { awk 'f && $1 ~ /^[0-9]+$/ {printf "%.2f\n", $4 * 1048576 * 8 / 1e9; ok=1; exit} /BW average/ {f=1} END {if (!ok) exit 1}'; }
pt_lat() { awk 'f && $1 ~ /^[0-9]+$/ {print $6; ok=1; exit} /t_avg/ {f=1} END {if (!ok) exit 1}'; }
pt_p99() { awk 'f && $1 ~ /^[0-9]+$/ {print $8; ok=1; exit} /t_avg/ {f=1} END {if (!ok) exit 1}'; }
pt_p999() { awk 'f && $1 ~ /^[0-9]+$/ {print $9; ok=1; exit} /t_avg/ {f=1} END {if (!ok) exit 1}'; }
json() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['$1'], 2))"; }
sf_lat() { json avg_us; }
sf_p99() { json p99_us; }
sf_p999() { json p999_us; }
sf_bw() { python3 -c "import json,sys; r=json.load(sys.stdin); print(round(r['bw_gbps'], 2))"; }
# ucx_perftest's last row: "Final: iters 50%ile average overall bw-average bw-overall rate..."
# (latency in µs, half a round trip; bandwidth in MiB/s).
ucx_lat() { awk '/^Final:/ {print $4; ok=1} END {if (!ok) exit 1}'; }
ucx_bw() { awk '/^Final:/ {printf "%.2f\n", $7 * 1048576 * 8 / 1e9; ok=1} END {if (!ok) exit 1}'; }

fab() { echo "$stack/bin/$1"; }
ucx=${SOFTEFA_UCX:-$(cabi/thirdparty/ucx.sh --prefix 2>/dev/null || true)}
[ -x "$ucx/bin/ucx_perftest" ] || { echo "no UCX (cabi/thirdparty/ucx.sh): its rows are left out" >&2; ucx=; }
for r in $(seq "$rounds"); do
  echo "== round $r"
  for f in efa efa-direct; do
    pair "fi_rdm_pingpong 64 $f" fi_lat -- "$(fab fi_rdm_pingpong)" -p efa -f $f -S 64 -I 10000 -E=@PORT@ \
      -- "$(fab fi_rdm_pingpong)" -p efa -f $f -S 64 -I 10000 -E=@PORT@ 127.0.0.1
    pair "fi_rdm_bw 8K $f" fi_bw -- "$(fab fi_rdm_bw)" -p efa -f $f -S 8192 -I 20000 -E=@PORT@ \
      -- "$(fab fi_rdm_bw)" -p efa -f $f -S 8192 -I 20000 -E=@PORT@ 127.0.0.1
    pair "fi_rma_bw write 64K $f" fi_bw -- "$(fab fi_rma_bw)" -p efa -f $f -o write -S 65536 -I 2000 -E=@PORT@ \
      -- "$(fab fi_rma_bw)" -p efa -f $f -o write -S 65536 -I 2000 -E=@PORT@ 127.0.0.1
  done
  pair "fi_rdm_tagged_bw 64K efa" fi_bw -- "$(fab fi_rdm_tagged_bw)" -p efa -f efa -S 65536 -I 2000 -E=@PORT@ \
    -- "$(fab fi_rdm_tagged_bw)" -p efa -f efa -S 65536 -I 2000 -E=@PORT@ 127.0.0.1
  pair "fi_pingpong 64 efa-direct" fi_lat -- "$(fab fi_pingpong)" -p efa -e rdm -f efa-direct -S 64 -I 10000 -B @PORT@ \
    -- "$(fab fi_pingpong)" -p efa -e rdm -f efa-direct -S 64 -I 10000 -P @PORT@ 127.0.0.1
  pt=(-d efa_0 -c SRD -x 0 -p @PORT@)
  pair "ib_send_bw 8K" pt_bw -- ib_send_bw "${pt[@]}" -s 8192 -n 20000 -- ib_send_bw "${pt[@]}" -s 8192 -n 20000 127.0.0.1
  pair "ib_send_lat 64 avg" pt_lat -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  if [ -n "$ucx" ]; then
    up=(env UCX_TLS=srd "$ucx/bin/ucx_perftest" -p @PORT@)
    pair "ucx tag_lat 64 avg" ucx_lat -- "${up[@]}" -- "${up[@]}" 127.0.0.1 -t tag_lat -s 64 -n 10000
    pair "ucx tag_bw 64K" ucx_bw -- "${up[@]}" -- "${up[@]}" 127.0.0.1 -t tag_bw -s 65536 -n 2000
    pair "ucx put_bw 64K" ucx_bw -- "${up[@]}" -- "${up[@]}" 127.0.0.1 -t ucp_put_bw -s 65536 -n 2000
  fi
  # The host device: one softefa device for both processes of each pair.
  "$sf" device --socket "$work/dev.sock" --addr 127.0.0.1:$((port + 500)) 2>/dev/null &
  dev=$!
  for _ in $(seq 50); do [ -S "$work/dev.sock" ] && break; sleep 0.1; done
  run=(run --device "$work/dev.sock")
  pair "fi_rma_bw write 64K efa-direct (host device)" fi_bw -- "$(fab fi_rma_bw)" -p efa -f efa-direct -o write -S 65536 -I 2000 -E=@PORT@ \
    -- "$(fab fi_rma_bw)" -p efa -f efa-direct -o write -S 65536 -I 2000 -E=@PORT@ 127.0.0.1
  pair "fi_pingpong 64 efa-direct (host device)" fi_lat -- "$(fab fi_pingpong)" -p efa -e rdm -f efa-direct -S 64 -I 10000 -B @PORT@ \
    -- "$(fab fi_pingpong)" -p efa -e rdm -f efa-direct -S 64 -I 10000 -P @PORT@ 127.0.0.1
  pair "ib_send_bw 8K (host device)" pt_bw -- ib_send_bw "${pt[@]}" -s 8192 -n 20000 -- ib_send_bw "${pt[@]}" -s 8192 -n 20000 127.0.0.1
  pair "ib_send_lat 64 avg (host device)" pt_lat -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  pair "ib_send_lat 64 p99 (host device)" pt_p99 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  pair "ib_send_lat 64 p99.9 (host device)" pt_p999 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null || true
  run=(run)
  pair "ib_send_lat 64 p99" pt_p99 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  pair "ib_send_lat 64 p99.9" pt_p999 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 -- ib_send_lat "${pt[@]}" -s 64 -n 10000 127.0.0.1
  perf "perf send_lat 64 avg" sf_lat send_lat -s 64 -n 10000
  perf "perf send_lat 64 p99" sf_p99 send_lat -s 64 -n 10000
  perf "perf send_lat 64 p99.9" sf_p999 send_lat -s 64 -n 10000
  perf "perf send_bw 8K" sf_bw send_bw -s 8192 -D 3
  perf "perf write_bw 64K" sf_bw write_bw -s 65536 -D 3
done

echo "== medians of $rounds rounds ($(date -u +%FT%RZ))"
for f in "$work"/*; do
  case $(basename "$f") in srv.out | cli.out | softefa) continue ;; esac
  printf '%-34s %s\n' "$(basename "$f")" "$(grep -v FAILED "$f" | sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "FAILED"; else print v[int((NR+1)/2)]}')"
done
