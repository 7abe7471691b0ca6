package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
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
	return []figure{
		{Transport: "udp", Workload: wBW, Metric: "goodput", Value: 20, Unit: "Gb/s"},
		{Transport: "tcp", Workload: wBW, Metric: "goodput", Value: 10, Unit: "Gb/s"},
		{Transport: "quic-go", Workload: wBW, Metric: "goodput", Value: 2, Unit: "Gb/s"},
		{Transport: "softefa", Workload: wBW, Metric: "goodput", Value: 12, Unit: "Gb/s"},
		{Transport: "udp", Workload: wLat, Metric: "p50", Value: 10, Unit: "µs"},
		{Transport: "softefa", Workload: wLat, Metric: "p50", Value: 20, Unit: "µs"},
	}
}

func TestRatiosAndTargets(t *testing.T) {
	figs := sampleFigures()
	ratios(figs)
	sf := figs[3]
	if sf.VsUDP != 0.6 || sf.VsTCP != 1.2 {
		t.Errorf("softefa ratios %v, %v; want 0.6, 1.2", sf.VsUDP, sf.VsTCP)
	}
	var b bytes.Buffer
	printTargets(&b, figs)
	out := b.String()
	for _, want := range []string{
		"bw 8 KiB ≥ 1.0× TCP                            1.20     1.00  met",
		"bw 8 KiB ≥ 5× quic-go                          6.00     5.00  met",
		"p50 ≤ raw UDP p50 + 5 µs                       0.75     1.00  MISSED",
		"not measured",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("targets lack %q:\n%s", want, out)
		}
	}
}

// The plots are well-formed SVG and the JSON has the fields the issue names.
func TestWriteOut(t *testing.T) {
	dir := t.TempDir()
	figs := sampleFigures()
	smp := samples{wLat: {"udp": {10 * time.Microsecond, 12 * time.Microsecond}, "softefa": {20 * time.Microsecond, 90 * time.Microsecond}}}
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
	for _, k := range []string{"transport", "workload", "metric", "value", "unit"} {
		if _, ok := got[0][k]; !ok {
			t.Errorf("results.json lacks %q: %v", k, got[0])
		}
	}
}
