package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Workload names, as they appear in the table and the JSON.
const (
	wBW       = "bw-8KiB"
	wRate     = "rate-64B"
	wLat      = "pingpong-64B"
	wBWLoss   = "bw-8KiB-loss1%"
	wLatLoss  = "pingpong-64B-loss1%"
	wLatFab   = "pingpong-64B-fabric" // through the fabric without loss: what the hop itself costs
	wBW4      = "bw-8KiB-4paths"
	wBW4Down  = "bw-8KiB-4paths-1down"
	wBW4Jit   = "bw-8KiB-4paths-jitter" // 4 paths, each datagram delayed 0-200 µs: reordered, none lost
	wWrite64K = "write-64KiB-samedev"
	wPeers    = "peers" // selects peers-N for every N of --peers

	// A loaded workload is its idle namesake run beside a CPU hog per core (load.go).
	loadedSuffix = "-loaded"
	wBWLoaded    = wBW + loadedSuffix
	wRateLoaded  = wRate + loadedSuffix
	wLatLoaded   = wLat + loadedSuffix
)

// samples keeps every round-trip time of one run per latency workload, mode and transport, for
// the CDF plots.
type samples map[string]map[string]map[string][]time.Duration // workload → mode → transport → RTTs

// workload is one row group of the table: what every transport is asked to do.
type workload struct {
	name   string
	size   int
	lat    bool                     // a ping-pong; otherwise a stream
	loaded bool                     // beside a CPU hog per core
	lossy  bool                     // through a lossy fabric: retransmissions expected
	skip   func(t transport) bool   // transports without this workload
	via    func(t transport) router // nil: direct
}

func measureAll(o *options) ([]figure, samples, error) {
	var ts []transport
	for _, t := range allTransports {
		if o.only == nil || o.only[t.name()] {
			ts = append(ts, t)
		}
	}
	var figs []figure
	smp := samples{}
	lossy := fabricRouter(o, "--raw", "--loss", "0.01")
	lossySoftefa := fabricRouter(o, "--loss", "0.01")
	plain, plainSoftefa := fabricRouter(o, "--raw"), fabricRouter(o)
	viaFabric := func(sf, other router) func(t transport) router {
		return func(t transport) router {
			if t.name() == "softefa" {
				return sf
			}
			return other
		}
	}
	idle := []workload{
		{name: wBW, size: 8192, skip: is("udp-1pkt")},
		{name: wRate, size: 64},
		{name: wLat, size: 64, lat: true, skip: is("udp-1pkt")},
	}
	wls := slices.Clone(idle)
	for _, w := range idle {
		w.name, w.loaded = w.name+loadedSuffix, true
		wls = append(wls, w)
	}
	wls = append(wls,
		workload{name: wBWLoss, size: 8192, lossy: true, skip: is("udp-1pkt", "tcp"), via: viaFabric(lossySoftefa, lossy)},
		workload{name: wLatFab, size: 64, lat: true, skip: is("udp", "udp-1pkt", "tcp"), via: viaFabric(plainSoftefa, plain)},
		// Raw UDP does not recover a lost ping: it has no figure with loss.
		workload{name: wLatLoss, size: 64, lat: true, lossy: true, skip: is("udp", "udp-1pkt", "tcp"), via: viaFabric(lossySoftefa, lossy)},
	)
	for _, wl := range wls {
		if !o.wants(wl.name) {
			continue
		}
		var h *hogs
		if wl.loaded {
			var err error
			if h, err = startHogs(o.hogs); err != nil {
				return nil, nil, err
			}
		}
		figs = append(figs, measureWorkload(o, wl, ts, smp)...)
		if h != nil {
			h.stop()
		}
	}
	if o.only != nil && !o.only["softefa"] {
		return figs, smp, nil
	}
	if o.wants(wBW4) || o.wants(wBW4Down) || o.wants(wBW4Jit) {
		for _, md := range o.modes {
			f, err := multipathFigures(o, md)
			if err != nil {
				f = o.failure(wBW4, md.name, "softefa", err)
			}
			figs = append(figs, f...)
		}
	}
	if o.wants(wWrite64K) {
		done := o.progress(wWrite64K, oneProc, "softefa")
		f, err := streamFigures(o, wWrite64K, "softefa", oneProc, 65536, false, func() (streamResult, error) {
			return sameDeviceWrite(65536, o.duration)
		})
		done()
		if err != nil {
			f = o.failure(wWrite64K, oneProc, "softefa", err)
		}
		figs = append(figs, f...)
	}
	return append(figs, peersFigures(o)...), smp, nil
}

// failure records that the measurement of a workload in a mode over a transport failed: the
// table shows it, the other measurements go on, and the bench exits with an error at the end.
func (o *options) failure(wl, md, tr string, err error) []figure {
	err = fmt.Errorf("%s over %s (%s): %w", wl, tr, md, err)
	fmt.Fprintf(o.log, "%v\n", err)
	o.failed = append(o.failed, err)
	return []figure{{Transport: tr, Mode: md, Workload: wl, Metric: "-", Note: "FAILED: " + err.Error()}}
}

// measureWorkload measures wl over each transport of ts, in each mode, the modes in turn so that
// the figures a ratio compares are measured minutes apart at most.
func measureWorkload(o *options, wl workload, ts []transport, smp samples) []figure {
	var figs []figure
	for _, md := range o.modes {
		for _, t := range ts {
			if wl.skip != nil && wl.skip(t) {
				continue
			}
			via := router(direct)
			if wl.via != nil {
				via = wl.via(t)
			}
			counts := t.name() == "softefa" && !wl.lossy
			done := o.progress(wl.name, md.name, t.name())
			var err error
			if wl.lat {
				var fs []figure
				var rtts []time.Duration
				fs, rtts, err = latencyFigures(o, wl.name, t.name(), md.name, counts, func() (pingResult, error) {
					return pingRun(md, t, wl.size, o.iters, via)
				})
				if err == nil {
					figs = append(figs, fs...)
				}
				if smp[wl.name] == nil {
					smp[wl.name] = map[string]map[string][]time.Duration{}
				}
				if smp[wl.name][md.name] == nil {
					smp[wl.name][md.name] = map[string][]time.Duration{}
				}
				smp[wl.name][md.name][t.name()] = rtts
			} else {
				var f []figure
				f, err = streamFigures(o, wl.name, t.name(), md.name, wl.size, counts, func() (streamResult, error) {
					return streamRun(md, t, wl.size, o.duration, via)
				})
				figs = append(figs, f...)
			}
			done()
			if err != nil {
				figs = append(figs, o.failure(wl.name, md.name, t.name(), err)...)
			}
		}
	}
	return figs
}

// streamRun starts a stream server for t in mode md and runs the client against it.
func streamRun(md mode, t transport, size int, d time.Duration, via router) (streamResult, error) {
	defer md.useProcs()()
	srv, err := md.spawn(job{transport: t.name(), kind: kindStream, size: size})
	if err != nil {
		return streamResult{}, err
	}
	r, err := t.stream(srv, size, d, via)
	return r, closeServer(srv, err)
}

// pingRun starts a ping-pong server for t in mode md and runs the client against it: n round
// trips timed after pingWarmup that are not.
func pingRun(md mode, t transport, size, n int, via router) (pingResult, error) {
	defer md.useProcs()()
	srv, err := md.spawn(job{transport: t.name(), kind: kindPingpong, size: size})
	if err != nil {
		return pingResult{}, err
	}
	r, err := t.pingpong(srv, size, pingWarmup+n, via)
	if len(r.rtts) >= pingWarmup {
		r.rtts = r.rtts[pingWarmup:]
	}
	return r, closeServer(srv, err)
}

// pingWarmup is how many round trips of each ping-pong run are not timed, as OSU's latency
// benchmark skips its first ones (1,000 for small messages in its 4.x releases, 100 now): the
// first ones of a run pay for its
// start (a connection's or a peer's first contact, code and memory touched for the first
// time, the processes' first collections), a millisecond or more on this machine kind
// (docs/performance.md), for every transport alike. The retransmission counts are the whole
// run's.
const pingWarmup = 1000

// progress starts a progress line for a workload, mode and transport; the measurements add
// their figures to it, and the function returned ends it with the time taken.
func (o *options) progress(wl, md, tr string) func() {
	fmt.Fprintf(o.log, "%s %s %s ", wl, md, tr)
	t0 := time.Now()
	return func() { fmt.Fprintf(o.log, "(%.1f s)\n", time.Since(t0).Seconds()) }
}

func (o *options) wants(workload string) bool {
	if o.workloads == nil || o.workloads[workload] {
		return true
	}
	return strings.HasPrefix(workload, wPeers+"-") && o.workloads[wPeers]
}

func is(names ...string) func(t transport) bool {
	return func(t transport) bool { return slices.Contains(names, t.name()) }
}

// streamFigures runs a stream measurement o.runs times: goodput for large messages, message
// rate for small ones; with counts, also the packets softefa retransmitted.
func streamFigures(o *options, wl, tr, md string, size int, counts bool, run func() (streamResult, error)) ([]figure, error) {
	var vals, lost []float64
	var cs []sfCounts
	for range o.runs {
		r, err := run()
		if err != nil {
			return nil, err
		}
		if r.elapsed <= 0 || r.msgs == 0 {
			return nil, fmt.Errorf("nothing arrived")
		}
		v := float64(r.msgs) / r.elapsed.Seconds() // messages per second
		if size >= 1024 {
			v = v * float64(size) * 8 / 1e9 // Gb/s
		} else {
			v /= 1e6 // millions of messages per second
		}
		vals = append(vals, v)
		lost = append(lost, float64(r.lost))
		cs = append(cs, r.sfCounts)
		fmt.Fprintf(o.log, "%s ", trim(v))
	}
	f := figure{Transport: tr, Mode: md, Workload: wl, Metric: "goodput", Value: median(vals), Unit: "Gb/s", Runs: vals}
	if size < 1024 {
		f.Metric, f.Unit = "rate", "Mmsg/s"
	}
	if wl == wWrite64K {
		f.Metric, f.Unit = "goodput", "GB/s"
		for i := range f.Runs {
			f.Runs[i] /= 8
		}
		f.Value = median(f.Runs)
	}
	if median(lost) > 0 {
		f.Note = fmt.Sprintf("unreliable: median %.0f datagrams lost per run", median(lost))
	}
	figs := []figure{f}
	if counts {
		figs = append(figs, retransFigure(f, cs))
	}
	return figs, nil
}

// retransFigure is the packets softefa retransmitted in each run of f (both devices), where
// nothing was lost; the note gives how many of them had arrived after all, and how many
// retransmission timeouts fired (the rest were declared lost by later packets' ACKs).
func retransFigure(f figure, cs []sfCounts) figure {
	r := figure{Transport: f.Transport, Mode: f.Mode, Workload: f.Workload, Metric: "retrans", Unit: "pkts"}
	var spurious, timeouts uint64
	for _, c := range cs {
		r.Runs = append(r.Runs, float64(c.retrans))
		spurious += c.spurious
		timeouts += c.timeouts
	}
	r.Value = median(r.Runs)
	r.Note = fmt.Sprintf("%d spurious, %d timeouts in all runs", spurious, timeouts)
	return r
}

// latencyFigures runs ping-pongs o.runs times and reports the medians of each run's p50, p99
// and p99.9 round-trip times (and, with counts, softefa's retransmissions); the RTTs of the last
// run are kept for the CDF.
func latencyFigures(o *options, wl, tr, md string, counts bool, run func() (pingResult, error)) ([]figure, []time.Duration, error) {
	pcts := []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p99", 0.99}, {"p99.9", 0.999}}
	runs := make([][]float64, len(pcts))
	var last []time.Duration
	var cs []sfCounts
	for range o.runs {
		r, err := run()
		if err != nil {
			return nil, nil, err
		}
		rtts := r.rtts
		slices.Sort(rtts)
		for i, p := range pcts {
			runs[i] = append(runs[i], us(quantile(rtts, p.q)))
		}
		cs = append(cs, r.sfCounts)
		fmt.Fprintf(o.log, "p50 %s µs ", trim(us(quantile(rtts, 0.5))))
		last = rtts
	}
	var figs []figure
	for i, p := range pcts {
		figs = append(figs, figure{Transport: tr, Mode: md, Workload: wl, Metric: p.name, Value: median(runs[i]), Unit: "µs", Runs: runs[i]})
	}
	if counts {
		figs = append(figs, retransFigure(figs[0], cs))
	}
	return figs, last, nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// quantile of sorted durations.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

// multipathFigures measures softefa through a 4-path fabric, healthy and with its busiest path
// blackholed a third of the way through the run, and checks that nothing was lost.
func multipathFigures(o *options, md mode) ([]figure, error) {
	sf := softefaTransport{paths: 4}
	var figs []figure
	if o.wants(wBW4) {
		healthy := fabricRouter(o, "--paths", "4", "--spread")
		done := o.progress(wBW4, md.name, "softefa")
		f, err := streamFigures(o, wBW4, "softefa", md.name, 8192, false, func() (streamResult, error) {
			return streamRun(md, sf, 8192, o.duration, healthy)
		})
		done()
		if err != nil {
			return nil, err
		}
		figs = append(figs, f...)
	}
	if o.wants(wBW4Jit) {
		f, err := jitterFigures(o, md, sf)
		if err != nil {
			f = o.failure(wBW4Jit, md.name, "softefa", err)
		}
		figs = append(figs, f...)
	}
	if !o.wants(wBW4Down) {
		return figs, nil
	}
	down := fabricRouter(o, "--paths", "4", "--spread", "--down", "busiest", "--down-after", (o.duration / 3).String())
	done := o.progress(wBW4Down, md.name, "softefa")
	// stream fails unless every completed send arrived exactly once, and a send that cannot be
	// delivered completes with an error: a run that returns is a run that lost nothing.
	f, err := streamFigures(o, wBW4Down, "softefa", md.name, 8192, false, func() (streamResult, error) {
		return streamRun(md, sf, 8192, o.duration, down)
	})
	done()
	if err != nil {
		// A stream that lost a message or failed with one path of four down is softefa's
		// failure, not the harness's: it goes into the table, and the bench fails at the end.
		return append(figs, o.failure(wBW4Down, md.name, "softefa", err)...), nil
	}
	f[0].Note = "0 messages lost"
	if healthy := value(figs, "softefa", wBW4, "goodput", md.name); healthy > 0 {
		figs = append(figs, figure{Transport: "softefa", Mode: md.name, Workload: wBW4Down, Metric: "of-healthy", Value: f[0].Value / healthy,
			Unit: "ratio", Runs: []float64{f[0].Value / healthy}})
	}
	return append(figs, f...), nil
}

// jitterFigures streams 8 KiB SENDs through 4 paths that lose nothing but delay each datagram
// by 0-200 µs, so that the paths, and datagrams within a path, overtake each other, and reports
// the packets retransmitted per 1,000 sent: all of them needless. A run in which the fabric
// itself dropped datagrams (its sockets overflowed) measures nothing of the kind and fails.
func jitterFigures(o *options, md mode, sf softefaTransport) ([]figure, error) {
	var overflowed atomic.Uint64
	via := fabricRouterCounting(o, &overflowed, "--paths", "4", "--spread", "--jitter", "200us")
	var sent []float64
	done := o.progress(wBW4Jit, md.name, "softefa")
	figs, err := streamFigures(o, wBW4Jit, "softefa", md.name, 8192, true, func() (streamResult, error) {
		r, err := streamRun(md, sf, 8192, o.duration, via)
		if n := overflowed.Swap(0); err == nil && n > 0 {
			err = fmt.Errorf("the fabric's sockets dropped %d datagrams: not a loss-free run", n)
		}
		sent = append(sent, float64(r.sent))
		return r, err
	})
	done()
	if err != nil {
		return nil, err
	}
	r := figs[len(figs)-1] // retransFigure's
	per := figure{Transport: "softefa", Mode: md.name, Workload: wBW4Jit, Metric: "retrans-per-1000", Unit: "pkts", Note: r.Note}
	for i, n := range r.Runs {
		per.Runs = append(per.Runs, 1000*n/max(sent[i], 1))
	}
	per.Value = median(per.Runs)
	return append(figs, per), nil
}

// fabricRouter starts `softefa fabric` towards the server with the given flags (and a new seed
// per run) and returns its front address.
func fabricRouter(o *options, flags ...string) router {
	return fabricRouterCounting(o, nil, flags...)
}

// fabricRouterCounting is fabricRouter that also adds to overflowed, if not nil, the datagrams
// the kernel dropped at the fabric's own sockets in each run (its "overflowed" line).
func fabricRouterCounting(o *options, overflowed *atomic.Uint64, flags ...string) router {
	seed := 0
	return func(server netip.AddrPort, more ...string) (netip.AddrPort, func() error, error) {
		seed++
		args := append([]string{"fabric", "--listen", "127.0.0.1:0", "--to", server.String(), "--seed", strconv.Itoa(seed)}, flags...)
		args = append(args, more...)
		cmd := exec.Command(o.fabric, args...)
		var stats bytes.Buffer // the per-path table it prints when it stops
		cmd.Stdout = &stats
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return netip.AddrPort{}, nil, err
		}
		if err := cmd.Start(); err != nil {
			return netip.AddrPort{}, nil, err
		}
		stop := func() error {
			cmd.Process.Signal(syscall.SIGINT)
			err := cmd.Wait()
			if overflowed != nil {
				n, ok := fabricOverflowed(stats.String())
				if !ok && err == nil {
					err = fmt.Errorf("softefa fabric printed no overflow count")
				}
				overflowed.Add(n)
			}
			if showCounters {
				fmt.Fprintf(o.log, "\nsoftefa %s\n%s", strings.Join(args, " "), stats.String())
			}
			return err
		}
		// The fabric's first line: "softefa fabric: FRONT -> SERVER, N paths".
		line, err := bufio.NewReader(stderr).ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) < 3 {
			stop()
			return netip.AddrPort{}, nil, fmt.Errorf("softefa fabric did not start: %q %v", line, err)
		}
		front, err := netip.ParseAddrPort(f[2])
		if err != nil {
			stop()
			return netip.AddrPort{}, nil, err
		}
		go func() { // keep draining, so that the fabric never blocks on a full pipe
			buf := make([]byte, 4096)
			for {
				if _, err := stderr.Read(buf); err != nil {
					return
				}
			}
		}()
		return front, stop, nil
	}
}

// fabricOverflowed finds the count in the fabric's "overflowed N" line.
func fabricOverflowed(stats string) (uint64, bool) {
	for _, line := range strings.Split(stats, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "overflowed" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// buildSoftefa builds ../cmd/softefa into a temporary directory.
func buildSoftefa() (string, func(), error) {
	dir, err := os.MkdirTemp("", "softefa-bench")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "softefa")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/softefa/softefa/cmd/softefa")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building softefa: %w", err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}
