// Command bench measures softefa beside raw UDP, TCP, quic-go and kcp-go on loopback, on the
// same workloads, and prints each figure with its ratio to raw UDP and to TCP in the same mode.
//
//	cd bench && go run . [--quick] [--json] [--out DIR] [--runs N] [--modes 1proc,2proc]
//
// Every workload with two ends runs in two modes: 1proc, both ends in this process as
// goroutines, and 2proc, the server end in a process of its own (this binary run again with a
// hidden --serve flag; server.go), which is how softefa is deployed: one device per process.
// The loaded workloads run beside a CPU hog per core (load.go); the many-peers workload
// measures one receiver QP in its own process serving thousands of sender devices (peers.go).
// Workloads that need loss or a dead path go through `softefa fabric` (built from
// ../cmd/softefa), one fabric process per run. Every figure is the median of --runs runs. It
// lives in a module of its own so that quic-go and kcp-go never enter the library's
// dependencies.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

type options struct {
	quick     bool
	json      bool
	out       string
	runs      int
	duration  time.Duration   // per bandwidth or rate run
	iters     int             // round trips per latency run
	only      map[string]bool // transports to run; nil: all
	workloads map[string]bool // workloads to run; nil: all
	modes     []mode          // where server ends run
	hogs      int             // CPU hogs beside the loaded workloads
	peers     []int           // peer counts of the many-peers workload
	fabric    string          // the softefa binary, for its fabric
	log       io.Writer
	failed    []error // the measurements that failed
}

// figure is one measured value: the median of its runs.
type figure struct {
	Transport string    `json:"transport"`
	Mode      string    `json:"mode"` // 1proc: both ends in one process; 2proc: the server end in its own
	Workload  string    `json:"workload"`
	Metric    string    `json:"metric"`
	Value     float64   `json:"value"`
	Unit      string    `json:"unit"`
	Runs      []float64 `json:"runs"`
	VsUDP     float64   `json:"vs_udp,omitempty"` // Value / raw UDP's value for the same workload, metric and mode
	VsTCP     float64   `json:"vs_tcp,omitempty"`
	VsIdle    float64   `json:"vs_idle,omitempty"` // loaded workloads: Value / the same transport's idle value, same mode
	Note      string    `json:"note,omitempty"`
}

func main() {
	// The hidden roles: this binary run again as a server end (server.go) or a CPU hog (load.go).
	if len(os.Args) > 1 {
		switch a := os.Args[1]; {
		case strings.HasPrefix(a, "--serve="):
			showCounters = slices.Contains(os.Args[2:], "--counters")
			if err := serveChild(strings.TrimPrefix(a, "--serve="), os.Stdin, os.Stdout); err != nil {
				fmt.Fprintln(os.Stderr, "bench --serve:", err)
				os.Exit(1)
			}
			return
		case a == "--hog":
			hog()
		}
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o := options{log: os.Stderr}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.BoolVar(&o.quick, "quick", false, "one short run of each measurement: checks the harness, not the speed")
	fs.BoolVar(&o.json, "json", false, "print the figures as JSON on stdout instead of the table")
	fs.StringVar(&o.out, "out", "", "write results.json and SVG plots into this directory")
	fs.IntVar(&o.runs, "runs", 3, "runs per measurement (the figure is their median)")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "length of each bandwidth or rate run")
	fs.IntVar(&o.iters, "iters", 20000, "timed round trips per latency run (after 1,000 untimed)")
	only := fs.String("only", "", "comma-separated transports to run (udp, udp-1pkt, tcp, quic-go, kcp-go, softefa)")
	fs.StringVar(&o.fabric, "softefa", "", "the softefa binary for `softefa fabric` (default: built from ../cmd/softefa)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	workloads := fs.String("workloads", "", "comma-separated workloads to run (default: all)")
	fs.BoolVar(&showCounters, "counters", false, "print softefa's device counters after each of its stream runs")
	modeList := fs.String("modes", oneProc+","+twoProc, "comma-separated modes: "+oneProc+" (both ends in this process), "+
		twoProc+" (the server end in a process of its own), "+twoProcOne+" (2proc with GOMAXPROCS=1 in both processes)")
	fs.IntVar(&o.hogs, "hogs", runtime.NumCPU(), "CPU hogs (spinning processes) beside the loaded workloads")
	peers := fs.String("peers", "1000,10000", "peer counts of the many-peers workload (--quick: 50,200)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.quick {
		o.runs, o.duration, o.iters = 1, 300*time.Millisecond, 500
		if !flagSet(fs, "peers") {
			*peers = "50,200"
		}
	}
	for _, m := range strings.Split(*modeList, ",") {
		i := slices.IndexFunc(modes, func(md mode) bool { return md.name == m })
		if i < 0 {
			return fmt.Errorf("--modes: no mode %q (%s, %s, %s)", m, oneProc, twoProc, twoProcOne)
		}
		o.modes = append(o.modes, modes[i])
	}
	for _, p := range strings.Split(*peers, ",") {
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return fmt.Errorf("--peers: %q", p)
		}
		o.peers = append(o.peers, n)
	}
	if o.runs < 1 || o.duration <= 0 || o.iters < 10 {
		return fmt.Errorf("--runs %d, --duration %v, --iters %d: need at least 1, >0 and 10", o.runs, o.duration, o.iters)
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, t := range strings.Split(*only, ",") {
			o.only[t] = true
		}
	}
	if *workloads != "" {
		o.workloads = map[string]bool{}
		for _, w := range strings.Split(*workloads, ",") {
			o.workloads[w] = true
		}
	}
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	if o.fabric == "" {
		bin, cleanup, err := buildSoftefa()
		if err != nil {
			return err
		}
		defer cleanup()
		o.fabric = bin
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	figs, samples, err := measureAll(&o)
	if err != nil {
		return err
	}
	ratios(figs)
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(figs); err != nil {
			return err
		}
	} else {
		printTable(os.Stdout, figs)
		printTargets(os.Stdout, figs)
	}
	if o.out != "" {
		if err := writeOut(o.out, figs, samples); err != nil {
			return err
		}
		fmt.Fprintf(o.log, "results and plots in %s\n", o.out)
	}
	if len(o.failed) > 0 {
		return fmt.Errorf("%d measurements failed:\n%w", len(o.failed), errors.Join(o.failed...))
	}
	return nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// ratios fills VsUDP and VsTCP from the raw UDP and TCP figures of the same workload, metric and
// mode, and VsIdle of a loaded workload's figures from the same transport's idle figure.
func ratios(figs []figure) {
	for i := range figs {
		f := &figs[i]
		if f.Metric == "retrans" {
			continue
		}
		if u := value(figs, "udp", f.Workload, f.Metric, f.Mode); u > 0 { // NaN (absent) is not > 0
			f.VsUDP = f.Value / u
		}
		if t := value(figs, "tcp", f.Workload, f.Metric, f.Mode); t > 0 {
			f.VsTCP = f.Value / t
		}
		if base, ok := strings.CutSuffix(f.Workload, loadedSuffix); ok {
			if v := value(figs, f.Transport, base, f.Metric, f.Mode); v > 0 {
				f.VsIdle = f.Value / v
			}
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printTable(w io.Writer, figs []figure) {
	fmt.Fprintf(w, "%-21s %-5s %-12s %-9s %10s %-6s %7s %7s %7s  %s\n", "workload", "mode", "metric", "transport", "value", "unit",
		"×udp", "×tcp", "×idle", "runs")
	last := ""
	for _, f := range figs {
		if f.Workload+f.Mode != last && last != "" {
			fmt.Fprintln(w)
		}
		last = f.Workload + f.Mode
		runs := make([]string, len(f.Runs))
		for i, r := range f.Runs {
			runs[i] = trim(r)
		}
		v := trim(f.Value)
		if strings.HasPrefix(f.Note, "FAILED") {
			v = "-"
		}
		fmt.Fprintf(w, "%-21s %-5s %-12s %-9s %10s %-6s %7s %7s %7s  %s", f.Workload, f.Mode, f.Metric, f.Transport, v, f.Unit,
			ratio(f.VsUDP), ratio(f.VsTCP), ratio(f.VsIdle), strings.Join(runs, " "))
		if f.Note != "" {
			fmt.Fprintf(w, "  (%s)", f.Note)
		}
		fmt.Fprintln(w)
	}
}

func trim(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func ratio(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}
