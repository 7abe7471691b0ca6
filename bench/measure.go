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
	wWrite64K = "write-64KiB-samedev"
)

// samples keeps every round-trip time of one run per transport and latency workload, for the
// CDF plots.
type samples map[string]map[string][]time.Duration // workload → transport → RTTs

func measureAll(o *options) ([]figure, samples, error) {
	all := []transport{rawUDP{}, rawUDP{noOffload: true}, tcpTransport, quicTransport, kcpTransport, softefaTransport{paths: 4}}
	var ts []transport
	for _, t := range all {
		if o.only == nil || o.only[t.name()] {
			ts = append(ts, t)
		}
	}
	var figs []figure
	smp := samples{}
	lossy := fabricRouter(o, "--raw", "--loss", "0.01")
	lossySoftefa := fabricRouter(o, "--loss", "0.01")
	plain, plainSoftefa := fabricRouter(o, "--raw"), fabricRouter(o)
	for _, wl := range []struct {
		name string
		size int
		lat  bool
		skip func(t transport) bool
		via  func(t transport) router
	}{
		{name: wBW, size: 8192, skip: is("udp-1pkt")},
		{name: wRate, size: 64},
		{name: wLat, size: 64, lat: true, skip: is("udp-1pkt")},
		{name: wBWLoss, size: 8192, skip: is("udp-1pkt", "tcp"), via: func(t transport) router {
			if t.name() == "softefa" {
				return lossySoftefa
			}
			return lossy
		}},
		{name: wLatFab, size: 64, lat: true, skip: is("udp", "udp-1pkt", "tcp"), via: func(t transport) router {
			if t.name() == "softefa" {
				return plainSoftefa
			}
			return plain
		}},
		// Raw UDP does not recover a lost ping: it has no figure with loss.
		{name: wLatLoss, size: 64, lat: true, skip: is("udp", "udp-1pkt", "tcp"), via: func(t transport) router {
			if t.name() == "softefa" {
				return lossySoftefa
			}
			return lossy
		}},
	} {
		if !o.wants(wl.name) {
			continue
		}
		for _, t := range ts {
			if wl.skip != nil && wl.skip(t) {
				continue
			}
			via := router(direct)
			if wl.via != nil {
				via = wl.via(t)
			}
			fmt.Fprintf(o.log, "%s %s ", wl.name, t.name())
			var err error
			if wl.lat {
				var fs []figure
				var rtts []time.Duration
				fs, rtts, err = latencyFigures(o, t, wl.name, wl.size, via)
				figs = append(figs, fs...)
				if smp[wl.name] == nil {
					smp[wl.name] = map[string][]time.Duration{}
				}
				smp[wl.name][t.name()] = rtts
			} else {
				var f []figure
				f, err = streamFigures(o, wl.name, t.name(), wl.size, func() (streamResult, error) { return t.stream(wl.size, o.duration, via) })
				figs = append(figs, f...)
			}
			fmt.Fprintln(o.log)
			if err != nil {
				return nil, nil, fmt.Errorf("%s over %s: %w", wl.name, t.name(), err)
			}
		}
	}
	if o.only != nil && !o.only["softefa"] {
		return figs, smp, nil
	}
	if o.wants(wBW4) || o.wants(wBW4Down) {
		f, err := multipathFigures(o)
		if err != nil {
			return nil, nil, err
		}
		figs = append(figs, f...)
	}
	if o.wants(wWrite64K) {
		fmt.Fprintf(o.log, "%s softefa ", wWrite64K)
		sf := softefaTransport{}
		f, err := streamFigures(o, wWrite64K, "softefa", 65536, func() (streamResult, error) {
			return sf.run(65536, o.duration, direct, true, true)
		})
		fmt.Fprintln(o.log)
		if err != nil {
			return nil, nil, err
		}
		figs = append(figs, f...)
	}
	return figs, smp, nil
}

func (o *options) wants(workload string) bool { return o.workloads == nil || o.workloads[workload] }

func is(names ...string) func(t transport) bool {
	return func(t transport) bool { return slices.Contains(names, t.name()) }
}

// streamFigures runs a stream measurement o.runs times: goodput for large messages, message
// rate for small ones.
func streamFigures(o *options, wl, tr string, size int, run func() (streamResult, error)) ([]figure, error) {
	var vals, lost []float64
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
		fmt.Fprintf(o.log, "%s ", trim(v))
	}
	f := figure{Transport: tr, Workload: wl, Metric: "goodput", Value: median(vals), Unit: "Gb/s", Runs: vals}
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
	return []figure{f}, nil
}

// latencyFigures runs ping-pongs o.runs times and reports the medians of each run's p50, p99
// and p99.9 round-trip times; the RTTs of the last run are kept for the CDF.
func latencyFigures(o *options, t transport, wl string, size int, via router) ([]figure, []time.Duration, error) {
	pcts := []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p99", 0.99}, {"p99.9", 0.999}}
	runs := make([][]float64, len(pcts))
	var last []time.Duration
	for range o.runs {
		rtts, err := t.pingpong(size, o.iters, via)
		if err != nil {
			return nil, nil, err
		}
		slices.Sort(rtts)
		for i, p := range pcts {
			runs[i] = append(runs[i], us(quantile(rtts, p.q)))
		}
		fmt.Fprintf(o.log, "p50 %s µs ", trim(us(quantile(rtts, 0.5))))
		last = rtts
	}
	var figs []figure
	for i, p := range pcts {
		figs = append(figs, figure{Transport: t.name(), Workload: wl, Metric: p.name, Value: median(runs[i]), Unit: "µs", Runs: runs[i]})
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
func multipathFigures(o *options) ([]figure, error) {
	sf := softefaTransport{paths: 4}
	healthy := fabricRouter(o, "--paths", "4", "--spread")
	fmt.Fprintf(o.log, "%s softefa ", wBW4)
	figs, err := streamFigures(o, wBW4, "softefa", 8192, func() (streamResult, error) { return sf.stream(8192, o.duration, healthy) })
	fmt.Fprintln(o.log)
	if err != nil {
		return nil, err
	}
	down := fabricRouter(o, "--paths", "4", "--spread", "--down", "busiest", "--down-after", (o.duration / 3).String())
	fmt.Fprintf(o.log, "%s softefa ", wBW4Down)
	// stream fails unless every completed send arrived exactly once, and a send that cannot be
	// delivered completes with an error: a run that returns is a run that lost nothing.
	f, err := streamFigures(o, wBW4Down, "softefa", 8192, func() (streamResult, error) { return sf.stream(8192, o.duration, down) })
	fmt.Fprintln(o.log)
	if err != nil {
		// A failure here is a result, not a harness error: it goes into the table.
		fmt.Fprintf(o.log, "%s softefa: %v\n", wBW4Down, err)
		f = []figure{{Transport: "softefa", Workload: wBW4Down, Metric: "goodput", Unit: "Gb/s", Note: "FAILED: " + err.Error()}}
		return append(figs, f...), nil
	}
	f[0].Note = "0 messages lost"
	if figs[0].Value > 0 {
		figs = append(figs, figure{Transport: "softefa", Workload: wBW4Down, Metric: "of-healthy", Value: f[0].Value / figs[0].Value,
			Unit: "ratio", Runs: []float64{f[0].Value / figs[0].Value}})
	}
	return append(figs, f...), nil
}

// fabricRouter starts `softefa fabric` towards the server with the given flags (and a new seed
// per run) and returns its front address.
func fabricRouter(o *options, flags ...string) router {
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
