package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedianAndQuantile(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3,1,2 = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 4,1,3,2 = %v", m)
	}
	s := make([]time.Duration, 1000)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Microsecond
	}
	for q, want := range map[float64]time.Duration{0.5: 500 * time.Microsecond, 0.99: 990 * time.Microsecond, 0.999: 999 * time.Microsecond} {
		if got := quantile(s, q); got != want {
			t.Errorf("quantile %v = %v, want %v", q, got, want)
		}
	}
}

func sampleFigures() []figure {
	fig := func(tr, md, wl, m string, v float64, runs ...float64) figure {
		return figure{Transport: tr, Mode: md, Workload: wl, Metric: m, Value: v, Runs: runs}
	}
	return []figure{
		fig("udp", twoProc, wBW, "goodput", 20),
		fig("tcp", twoProc, wBW, "goodput", 10),
		fig("quic-go", twoProc, wBW, "goodput", 2),
		fig("softefa", twoProc, wBW, "goodput", 12),
		// The same workload in one process: its ratios must not mix with the other mode's.
		fig("udp", oneProc, wBW, "goodput", 40),
		fig("tcp", oneProc, wBW, "goodput", 30),
		fig("softefa", oneProc, wBW, "goodput", 15),
		fig("udp-1pkt", twoProc, wRate, "rate", 0.4),
		fig("softefa", twoProc, wRate, "rate", 1.6),
		fig("tcp", twoProc, wRate, "rate", 10),
		fig("udp", twoProc, wLat, "p50", 10),
		fig("udp", twoProc, wLat, "p99", 20),
		fig("tcp", twoProc, wLat, "p99", 20),
		fig("softefa", twoProc, wLat, "p50", 14),
		fig("softefa", twoProc, wLat, "p99", 30),
		fig("softefa", twoProc, wLat, "p99.9", 100),
		fig("softefa", twoProc, wLat, "retrans", 0, 0, 0, 0),
		fig("softefa", twoProc, wLatFab, "p99", 400),
		fig("softefa", twoProc, wLatLoss, "p99", 900),
		// Through jitter, retransmissions count per 1,000 packets, not in the idle target.
		fig("softefa", twoProc, wBW4Jit, "retrans", 12, 12, 12),
		fig("softefa", twoProc, wBW4Jit, "retrans-per-1000", 0.5, 0.5, 0.5),
		// Loaded: TCP keeps 80% of its bandwidth, softefa 50% (≥ 40%: met); TCP 50% of its rate,
		// softefa 20% (< 25%: missed); TCP's p99 ×3, softefa's ×5 (≤ 6: met).
		fig("tcp", twoProc, wBWLoaded, "goodput", 8),
		fig("softefa", twoProc, wBWLoaded, "goodput", 6),
		fig("tcp", twoProc, wRateLoaded, "rate", 5),
		fig("softefa", twoProc, wRateLoaded, "rate", 0.32),
		fig("tcp", twoProc, wLatLoaded, "p99", 60),
		fig("softefa", twoProc, wLatLoaded, "p99", 150),
		fig("softefa", twoProc, wBWLoaded, "retrans", 0, 0, 3, 0),
		fig("softefa", twoProc, wLatLoaded, "retrans", 1, 0, 1, 2),
		fig("softefa", twoProc, "peers-1000", "heap/peer", 800),
		fig("softefa", twoProc, "peers-10000", "heap/peer", 900),
		fig("softefa", twoProc, "peers-10000", "idle-cpu", 0.2),
		fig("softefa", twoProc, "peers-10000", "idle-wakeups", 0),
		fig("softefa", oneProc, wWrite64K, "goodput", 31),
	}
}

func TestRatiosWithinMode(t *testing.T) {
	figs := sampleFigures()
	ratios(figs)
	for _, c := range []struct {
		tr, md, wl, m  string
		udp, tcp, idle float64
	}{
		{"softefa", twoProc, wBW, "goodput", 0.6, 1.2, 0},
		{"softefa", oneProc, wBW, "goodput", 0.375, 0.5, 0},
		{"tcp", twoProc, wBWLoaded, "goodput", 0, 1, 0.8},
		{"softefa", twoProc, wLatLoaded, "p99", 0, 2.5, 5},
		{"softefa", twoProc, wLat, "retrans", 0, 0, 0}, // counts have no ratios
	} {
		i := slices.IndexFunc(figs, func(f figure) bool {
			return f.Transport == c.tr && f.Mode == c.md && f.Workload == c.wl && f.Metric == c.m
		})
		f := figs[i]
		if f.VsUDP != c.udp || f.VsTCP != c.tcp || f.VsIdle != c.idle {
			t.Errorf("%s %s %s %s: ×udp %v ×tcp %v ×idle %v; want %v %v %v", c.tr, c.md, c.wl, c.m, f.VsUDP, f.VsTCP, f.VsIdle, c.udp, c.tcp, c.idle)
		}
	}
}

func TestTargets(t *testing.T) {
	figs := sampleFigures()
	ratios(figs)
	want := map[string]struct {
		got   float64
		state string
	}{
		"bw 8 KiB vs TCP":                          {1.2, "met"},
		"bw 8 KiB vs quic-go":                      {6, "met"},
		"rate 64 B vs udp-1pkt":                    {4, "MISSED"},
		"ping-pong 64 B p50 (≤ raw UDP + 3 µs)":    {14, "MISSED"},
		"ping-pong 64 B p99 (≤ 1.3× raw UDP)":      {30, "MISSED"},
		"ping-pong 64 B p99.9 (≤ 3× own p99)":      {100.0 / 30, "MISSED"},
		"1% loss p99 (≤ 2× own loss-free, fabric)": {900, "MISSED"},
		"loaded bw ×idle (≥ TCP's / 2)":            {0.5, "met"},
		"loaded rate ×idle (≥ TCP's / 2)":          {0.2, "MISSED"},
		"loaded p99 ×idle (≤ 2× TCP's)":            {5, "met"},
		"loaded: packets retransmitted, no loss":   {3, "MISSED"},
		"idle: packets retransmitted, no loss":     {0, "met"},
		"jitter 0-200 µs: retransmitted per 1,000": {0.5, "met"},
		"10,000 peers: heap per idle peer":         {900, "met"},
		"peers: linear (per peer 10,000 / 1,000)":  {1.125, "met"},
		"10,000 idle peers: receiver CPU":          {0.2, "met"},
		"10,000 idle peers: engine wakeups":        {0, "met"},
		"same-device WRITE 64 KiB":                 {31, "met"},
	}
	ts := targets(figs)
	if len(ts) != len(want) {
		t.Errorf("%d targets, want %d", len(ts), len(want))
	}
	for _, tg := range ts {
		w, ok := want[tg.What]
		if !ok {
			t.Errorf("unexpected target %q", tg.What)
			continue
		}
		if math.Abs(tg.Got-w.got) > 1e-9 || tg.state() != w.state {
			t.Errorf("%s: got %v (%s); want %v (%s)", tg.What, tg.Got, tg.state(), w.got, w.state)
		}
	}
	// Without figures every target is "not measured", never met or missed.
	for _, tg := range targets(nil) {
		if tg.state() != "not measured" {
			t.Errorf("%s with no figures: %s", tg.What, tg.state())
		}
	}
	var b bytes.Buffer
	printTargets(&b, figs)
	for _, line := range []string{
		"bw 8 KiB vs TCP                                   1.2 ≥          1 ×      met",
		"ping-pong 64 B p50 (≤ raw UDP + 3 µs)            14.0 ≤       13.0 µs     MISSED",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("targets lack %q:\n%s", line, b.String())
		}
	}
}

func TestParseJob(t *testing.T) {
	j, err := parseJob("softefa/pingpong/64")
	if err != nil || j != (job{transport: "softefa", kind: kindPingpong, size: 64}) || j.String() != "softefa/pingpong/64" {
		t.Errorf("parseJob: %+v, %v", j, err)
	}
	for _, bad := range []string{"", "udp/stream", "udp/stream/0", "udp/flood/64", "udp/stream/x"} {
		if _, err := parseJob(bad); err == nil {
			t.Errorf("parseJob(%q) succeeded", bad)
		}
	}
}

// A child's protocol, run in this process over pipes: hello, a request, the end of stdin.
func TestServeChild(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- serveChild("udp/pingpong/64", inR, outW); outW.Close() }()
	dec, enc := json.NewDecoder(outR), json.NewEncoder(inW)
	var hello msg
	if err := dec.Decode(&hello); err != nil || !hello.Addr.IsValid() || hello.Err != "" {
		t.Fatalf("hello %+v, %v", hello, err)
	}
	for _, req := range []msg{{Op: opPeer}, {Op: opFinish}, {Op: opStats}, {Op: "dance"}} {
		if err := enc.Encode(req); err != nil {
			t.Fatal(err)
		}
		var rep msg
		if err := dec.Decode(&rep); err != nil {
			t.Fatal(err)
		}
		if wantErr := req.Op == opStats || req.Op == "dance"; (rep.Err != "") != wantErr {
			t.Errorf("%s: reply %+v", req.Op, rep)
		}
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Errorf("serveChild: %v", err)
	}
	if err := serveChild("nosuch/stream/64", strings.NewReader(""), io.Discard); err == nil {
		t.Error("serveChild started an unknown transport")
	}
}

// The plots are well-formed SVG and the JSON has the fields the issue names.
func TestWriteOut(t *testing.T) {
	dir := t.TempDir()
	figs := sampleFigures()
	smp := samples{wLat: {
		twoProc: {"udp": {10 * time.Microsecond, 12 * time.Microsecond}, "softefa": {20 * time.Microsecond, 90 * time.Microsecond}},
		oneProc: {"softefa": {15 * time.Microsecond, 40 * time.Microsecond}},
	}}
	if err := writeOut(dir, figs, smp); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{wBW + ".svg", wBWLoss + ".svg", wRate + ".svg", wLat + "-cdf.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(bytes.NewReader(b))
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"transport", "mode", "workload", "metric", "value", "unit"} {
		if _, ok := got[0][k]; !ok {
			t.Errorf("results.json lacks %q: %v", k, got[0])
		}
	}
}
