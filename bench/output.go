package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func value(figs []figure, tr, wl, m string) float64 {
	for _, f := range figs {
		if f.Transport == tr && f.Workload == wl && f.Metric == m {
			return f.Value
		}
	}
	return math.NaN()
}

// printTargets checks softefa's figures against the targets of issue 7.
func printTargets(w io.Writer, figs []figure) {
	v := func(tr, wl, m string) float64 { return value(figs, tr, wl, m) }
	sf := func(wl, m string) float64 { return v("softefa", wl, m) }
	type target struct {
		what     string
		got, min float64 // met when got >= min
	}
	ts := []target{
		{"bw 8 KiB ≥ 1.0× TCP", sf(wBW, "goodput") / v("tcp", wBW, "goodput"), 1},
		{"bw 8 KiB ≥ 5× quic-go", sf(wBW, "goodput") / v("quic-go", wBW, "goodput"), 5},
		{"rate 64 B ≥ 5× raw UDP (1 msg/datagram)", sf(wRate, "rate") / v("udp-1pkt", wRate, "rate"), 5},
		{"rate 64 B ≥ 10× kcp-go", sf(wRate, "rate") / v("kcp-go", wRate, "rate"), 10},
		// For "at most" targets, got is the margin: limit / figure, met when ≥ 1.
		{"p50 ≤ raw UDP p50 + 5 µs", (v("udp", wLat, "p50") + 5) / sf(wLat, "p50"), 1},
		{"p99 ≤ 1.5× raw UDP p99", 1.5 * v("udp", wLat, "p99") / sf(wLat, "p99"), 1},
		{"1% loss: p99 ≤ 5× own loss-free p99", 5 * sf(wLat, "p99") / sf(wLatLoss, "p99"), 1},
		{"1% loss: p99 below quic-go's", v("quic-go", wLatLoss, "p99") / sf(wLatLoss, "p99"), 1},
		{"1% loss: p99 below kcp-go's", v("kcp-go", wLatLoss, "p99") / sf(wLatLoss, "p99"), 1},
		{"1 of 4 paths down: bw ≥ 60% of healthy", sf(wBW4Down, "of-healthy"), 0.6},
		{"same-device WRITE 64 KiB ≥ 5 GB/s", sf(wWrite64K, "goodput"), 5},
	}
	fmt.Fprintf(w, "\n%-42s %8s %8s  %s\n", "target (softefa)", "measured", "needed", "")
	for _, t := range ts {
		state := "met"
		switch {
		case math.IsNaN(t.got):
			state = "not measured"
		case t.got < t.min:
			state = "MISSED"
		}
		fmt.Fprintf(w, "%-42s %8.2f %8.2f  %s\n", t.what, t.got, t.min, state)
	}
	fmt.Fprintln(w, "(ratios; for upper limits, the limit divided by the figure)")
}

func writeOut(dir string, figs []figure, smp samples) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(figs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var sb strings.Builder
	printTable(&sb, figs)
	printTargets(&sb, figs)
	if err := os.WriteFile(filepath.Join(dir, "results.txt"), []byte(sb.String()), 0o644); err != nil {
		return err
	}
	for _, wl := range []string{wBW, wBWLoss} {
		if err := os.WriteFile(filepath.Join(dir, wl+".svg"), barsSVG(figs, wl, "goodput"), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, wRate+".svg"), barsSVG(figs, wRate, "rate"), 0o644); err != nil {
		return err
	}
	for wl, byT := range smp {
		if err := os.WriteFile(filepath.Join(dir, wl+"-cdf.svg"), cdfSVG(wl, byT), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var palette = map[string]string{"udp": "#777777", "udp-1pkt": "#aaaaaa", "tcp": "#1f77b4", "quic-go": "#ff7f0e",
	"kcp-go": "#2ca02c", "softefa": "#d62728"}

const svgHead = `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">` +
	`<rect width="100%%" height="100%%" fill="white"/>`

// barsSVG draws one bar per transport for a workload's metric.
func barsSVG(figs []figure, wl, metric string) []byte {
	var fs []figure
	for _, f := range figs {
		if f.Workload == wl && f.Metric == metric {
			fs = append(fs, f)
		}
	}
	const W, H, left, bottom, top = 560, 320, 60, 40, 40
	var b strings.Builder
	fmt.Fprintf(&b, svgHead, W, H)
	top1 := 0.0
	for _, f := range fs {
		top1 = max(top1, f.Value)
	}
	if len(fs) == 0 || top1 == 0 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	unit := fs[0].Unit
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: %s (%s), median of runs</text>`, left, wl, metric, unit)
	plotH := float64(H - bottom - top)
	slot := float64(W-left-20) / float64(len(fs))
	for i, f := range fs {
		h := f.Value / top1 * plotH
		x := float64(left) + float64(i)*slot + slot*0.15
		y := float64(top) + plotH - h
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, y, slot*0.7, h, palette[f.Transport])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x+slot*0.35, y-4, trim(f.Value))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x+slot*0.35, H-bottom+16, f.Transport)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`, left, H-bottom, W-10, H-bottom)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// cdfSVG draws the round-trip-time CDFs of one latency workload, on a log time axis.
func cdfSVG(wl string, byT map[string][]time.Duration) []byte {
	const W, H, left, bottom, top, right = 640, 380, 60, 50, 40, 130
	var b strings.Builder
	fmt.Fprintf(&b, svgHead, W, H)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: round-trip time CDF (last run)</text>`, left, wl)
	lo, hi := math.Inf(1), 0.0
	for _, rtts := range byT {
		if len(rtts) > 0 {
			lo, hi = min(lo, us(rtts[0])), max(hi, us(rtts[len(rtts)-1]))
		}
	}
	if hi == 0 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	lo = math.Pow(10, math.Floor(math.Log10(max(lo, 1))))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	xOf := func(v float64) float64 {
		return float64(left) + (math.Log10(max(v, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*pw
	}
	yOf := func(q float64) float64 { return float64(top) + (1-q)*ph }
	for d := lo; d <= hi; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%g µs</text>`,
			xOf(d), top, xOf(d), H-bottom, xOf(d), H-bottom+16, d)
	}
	for _, q := range []float64{0, 0.5, 0.9, 0.99, 1} {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`, left-4, yOf(q)+4, q)
	}
	names := make([]string, 0, len(byT))
	for n := range byT {
		names = append(names, n)
	}
	slices.Sort(names)
	for k, n := range names {
		rtts := byT[n]
		var pts strings.Builder
		step := max(1, len(rtts)/400)
		for i := 0; i < len(rtts); i += step {
			fmt.Fprintf(&pts, "%.1f,%.1f ", xOf(us(rtts[i])), yOf(float64(i+1)/float64(len(rtts))))
		}
		fmt.Fprintf(&pts, "%.1f,%.1f", xOf(us(rtts[len(rtts)-1])), yOf(1))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, palette[n], pts.String())
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`,
			W-right+10, top+k*18, palette[n], W-right+26, top+k*18+10, n)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
