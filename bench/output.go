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

// value is the figure of a transport, workload, metric and mode; NaN if there is none.
func value(figs []figure, tr, wl, m, md string) float64 {
	for _, f := range figs {
		if f.Transport == tr && f.Workload == wl && f.Metric == m && f.Mode == md {
			return f.Value
		}
	}
	return math.NaN()
}

// printTargets checks softefa's figures against the targets of issue 7, on the figures of the
// two-process mode, which is how softefa is deployed (same-device WRITE has one process by
// nature).
func printTargets(w io.Writer, figs []figure) {
	v := func(tr, wl, m string) float64 { return value(figs, tr, wl, m, twoProc) }
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
		{"same-device WRITE 64 KiB ≥ 5 GB/s", value(figs, "softefa", wWrite64K, "goodput", oneProc), 5},
	}
	fmt.Fprintf(w, "\n%-42s %8s %8s  %s\n", "target (softefa, 2proc)", "measured", "needed", "")
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
	for wl, metric := range map[string]string{wBW: "goodput", wBWLoss: "goodput", wRate: "rate", wBWLoaded: "goodput", wRateLoaded: "rate"} {
		if err := os.WriteFile(filepath.Join(dir, wl+".svg"), barsSVG(figs, wl, metric), 0o644); err != nil {
			return err
		}
	}
	for wl, byMode := range smp {
		if err := os.WriteFile(filepath.Join(dir, wl+"-cdf.svg"), cdfSVG(wl, byMode), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var palette = map[string]string{"udp": "#777777", "udp-1pkt": "#aaaaaa", "tcp": "#1f77b4", "quic-go": "#ff7f0e",
	"kcp-go": "#2ca02c", "softefa": "#d62728"}

const svgHead = `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">` +
	`<rect width="100%%" height="100%%" fill="white"/>`

// barsSVG draws a workload's metric: a group of bars per transport, one bar per mode (1proc
// light, 2proc dark).
func barsSVG(figs []figure, wl, metric string) []byte {
	var fs []figure
	var trs []string
	for _, f := range figs {
		if f.Workload == wl && f.Metric == metric {
			fs = append(fs, f)
			if !slices.Contains(trs, f.Transport) {
				trs = append(trs, f.Transport)
			}
		}
	}
	const W, H, left, bottom, top = 640, 320, 60, 40, 40
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
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: %s (%s), median of runs; light %s, dark %s</text>`,
		left, wl, metric, unit, oneProc, twoProc)
	plotH := float64(H - bottom - top)
	slot := float64(W-left-20) / float64(len(trs))
	for i, tr := range trs {
		x0 := float64(left) + float64(i)*slot + slot*0.1
		for k, md := range []string{oneProc, twoProc} {
			v := value(fs, tr, wl, metric, md)
			if math.IsNaN(v) {
				continue
			}
			h := v / top1 * plotH
			x, y := x0+float64(k)*slot*0.4, float64(top)+plotH-h
			opacity := 1.0
			if md == oneProc {
				opacity = 0.45
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%g"/>`, x, y, slot*0.38, h, palette[tr], opacity)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`, x+slot*0.19, y-4, trim(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x0+slot*0.4, H-bottom+16, tr)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`, left, H-bottom, W-10, H-bottom)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// cdfSVG draws the round-trip-time CDFs of one latency workload, on a log time axis: a line per
// transport and mode (2proc solid, 1proc dashed).
func cdfSVG(wl string, byMode map[string]map[string][]time.Duration) []byte {
	const W, H, left, bottom, top, right = 680, 380, 60, 50, 40, 150
	var b strings.Builder
	fmt.Fprintf(&b, svgHead, W, H)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: round-trip time CDF (last run)</text>`, left, wl)
	type line struct {
		tr, md string
		rtts   []time.Duration
	}
	var lines []line
	lo, hi := math.Inf(1), 0.0
	for md, byT := range byMode {
		for tr, rtts := range byT {
			if len(rtts) > 0 {
				lo, hi = min(lo, us(rtts[0])), max(hi, us(rtts[len(rtts)-1]))
				lines = append(lines, line{tr, md, rtts})
			}
		}
	}
	if hi == 0 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	slices.SortFunc(lines, func(a, b line) int { return strings.Compare(a.tr+" "+a.md, b.tr+" "+b.md) })
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
	for k, l := range lines {
		var pts strings.Builder
		step := max(1, len(l.rtts)/400)
		for i := 0; i < len(l.rtts); i += step {
			fmt.Fprintf(&pts, "%.1f,%.1f ", xOf(us(l.rtts[i])), yOf(float64(i+1)/float64(len(l.rtts))))
		}
		fmt.Fprintf(&pts, "%.1f,%.1f", xOf(us(l.rtts[len(l.rtts)-1])), yOf(1))
		dash := ""
		if l.md == oneProc {
			dash = ` stroke-dasharray="5,3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, palette[l.tr], dash, pts.String())
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s %s</text>`,
			W-right+8, top+k*18+6, W-right+26, top+k*18+6, palette[l.tr], dash, W-right+30, top+k*18+10, l.tr, l.md)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
