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

// target is one of softefa's targets: met when Got op Limit. A NaN Got or Limit: not measured.
type target struct {
	What  string
	Got   float64
	Op    string // "≥" or "≤"
	Limit float64
	Unit  string
}

func (t target) state() string {
	switch {
	case math.IsNaN(t.Got) || math.IsNaN(t.Limit):
		return "not measured"
	case t.Op == "≥" && t.Got >= t.Limit, t.Op == "≤" && t.Got <= t.Limit:
		return "met"
	}
	return "MISSED"
}

// targets are this round's targets (issue 14), from the run's figures: those of the two-process
// mode, which is how softefa is deployed, except same-device WRITE, which has one process by
// nature.
func targets(figs []figure) []target {
	v := func(tr, wl, m string) float64 { return value(figs, tr, wl, m, twoProc) }
	sf := func(wl, m string) float64 { return v("softefa", wl, m) }
	// vsIdle is a transport's loaded figure over its idle one.
	vsIdle := func(tr, wl, m string) float64 { return v(tr, wl+loadedSuffix, m) / v(tr, wl, m) }
	peers := func(n int, m string) float64 { return sf(fmt.Sprintf("%s-%d", wPeers, n), m) }
	return []target{
		{"bw 8 KiB vs TCP", sf(wBW, "goodput") / v("tcp", wBW, "goodput"), "≥", 1, "×"},
		{"bw 8 KiB vs quic-go", sf(wBW, "goodput") / v("quic-go", wBW, "goodput"), "≥", 5, "×"},
		{"rate 64 B vs udp-1pkt", sf(wRate, "rate") / v("udp-1pkt", wRate, "rate"), "≥", 5, "×"},
		{"ping-pong 64 B p50 (≤ raw UDP + 3 µs)", sf(wLat, "p50"), "≤", v("udp", wLat, "p50") + 3, "µs"},
		{"ping-pong 64 B p99 (≤ 1.3× raw UDP)", sf(wLat, "p99"), "≤", 1.3 * v("udp", wLat, "p99"), "µs"},
		{"ping-pong 64 B p99.9 (≤ 3× own p99)", sf(wLat, "p99.9") / sf(wLat, "p99"), "≤", 3, "×"},
		{"1% loss p99 (≤ 2× own loss-free, fabric)", sf(wLatLoss, "p99"), "≤", 2 * sf(wLatFab, "p99"), "µs"},
		// Loaded/idle ratios: softefa's may be at worst half TCP's (goodput, rate) or twice it (p99).
		{"loaded bw ×idle (≥ TCP's / 2)", vsIdle("softefa", wBW, "goodput"), "≥", vsIdle("tcp", wBW, "goodput") / 2, "×"},
		{"loaded rate ×idle (≥ TCP's / 2)", vsIdle("softefa", wRate, "rate"), "≥", vsIdle("tcp", wRate, "rate") / 2, "×"},
		{"loaded p99 ×idle (≤ 2× TCP's)", vsIdle("softefa", wLat, "p99"), "≤", 2 * vsIdle("tcp", wLat, "p99"), "×"},
		{"loaded: packets retransmitted, no loss", worstRetrans(figs, true), "≤", 0, "pkts"},
		{"idle: packets retransmitted, no loss", worstRetrans(figs, false), "≤", 0, "pkts"},
		{"jitter 0-200 µs: retransmitted per 1,000", sf(wBW4Jit, "retrans-per-1000"), "≤", 1, "pkts"},
		{"10,000 peers: heap per idle peer", peers(10000, "heap/peer"), "≤", 1024, "B"},
		{"peers: linear (per peer 10,000 / 1,000)", peers(10000, "heap/peer") / peers(1000, "heap/peer"), "≤", peersLinear, "×"},
		{"10,000 idle peers: receiver CPU", peers(10000, "idle-cpu"), "≤", idleCPU, "ms/s"},
		{"10,000 idle peers: engine wakeups", peers(10000, "idle-wakeups"), "≤", 0, "/s"},
		{"same-device WRITE 64 KiB", value(figs, "softefa", wWrite64K, "goodput", oneProc), "≥", 30, "GB/s"},
	}
}

const (
	// peersLinear is how much more a peer may cost among 10,000 than among 1,000 for the cost to
	// count as linear: a hash table's load factor alone moves the cost per entry by a few tens of
	// per cent between sizes.
	peersLinear = 1.25
	// idleCPU is "no CPU" for an idle process, in ms of CPU per s: the Go runtime's own
	// background work (sysmon) and the reading of the figures stay well below it.
	idleCPU = 1.0
)

// worstRetrans is the most packets softefa retransmitted in any one run of the two-process
// workloads without loss or reordering, loaded or idle; NaN if there was none.
func worstRetrans(figs []figure, loaded bool) float64 {
	worst := math.NaN()
	for _, f := range figs {
		if f.Transport != "softefa" || f.Metric != "retrans" || f.Mode != twoProc || f.Workload == wBW4Jit ||
			strings.HasSuffix(f.Workload, loadedSuffix) != loaded {
			continue
		}
		for _, r := range f.Runs {
			if math.IsNaN(worst) || r > worst {
				worst = r
			}
		}
	}
	return worst
}

// printTargets checks softefa's figures against this round's targets.
func printTargets(w io.Writer, figs []figure) {
	fmt.Fprintf(w, "\n%-42s %10s %12s %-5s  %s\n", "target (softefa, 2proc)", "measured", "needed", "", "")
	for _, t := range targets(figs) {
		fmt.Fprintf(w, "%-42s %10s %s %10s %-5s  %s\n", t.What, num(t.Got), t.Op, num(t.Limit), t.Unit, t.state())
	}
}

func num(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return trim(v)
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
