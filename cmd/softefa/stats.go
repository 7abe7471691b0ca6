package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"
	"unicode"
)

// counterFields lists a counters struct's fields with EFA's names (TxBytes → tx_bytes).
func counterFields(v any) (names []string, values []uint64) {
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		names = append(names, snake(rv.Type().Field(i).Name))
		values = append(values, rv.Field(i).Uint())
	}
	return names, values
}

// snake turns a Go field name into EFA's counter name: RDMAReadWRErr → rdma_read_wr_err.
func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return strings.ReplaceAll(b.String(), "w_rs", "wrs") // SendWRs → send_wrs

}

// printStats prints the device's counters, each QP's, and each path's figures.
func printStats(w io.Writer, e *endpoint) {
	names, values := counterFields(e.ctx.Counters())
	fmt.Fprintf(w, "device %s counters:\n", e.dev.Name())
	for i, n := range names {
		fmt.Fprintf(w, "  %-28s %d\n", n, values[i])
	}
	for _, qp := range e.qps {
		names, values := counterFields(qp.Counters())
		fmt.Fprintf(w, "QP %d counters:\n", qp.QPN())
		for i, n := range names {
			fmt.Fprintf(w, "  %-28s %d\n", n, values[i])
		}
	}
	for _, p := range e.ctx.PathStats() {
		fmt.Fprintf(w, "path %d to %v: srtt %v sent %d lost %d failed %v cwnd %.0f\n",
			p.Path, p.Peer, p.SRTT.Round(time.Microsecond), p.Sent, p.Lost, p.Failed, p.Cwnd)
	}
}

// writeMetrics writes the Prometheus text exposition of e's counters.
func writeMetrics(w io.Writer, e *endpoint) {
	dev := e.dev.Name()
	names, values := counterFields(e.ctx.Counters())
	for i, n := range names {
		fmt.Fprintf(w, "# TYPE softefa_%s counter\nsoftefa_%s{device=%q} %d\n", n, n, dev, values[i])
	}
	for _, qp := range e.qps {
		names, values := counterFields(qp.Counters())
		for i, n := range names {
			fmt.Fprintf(w, "softefa_qp_%s{device=%q,qpn=\"%d\"} %d\n", n, dev, qp.QPN(), values[i])
		}
	}
	for _, p := range e.ctx.PathStats() {
		l := fmt.Sprintf("device=%q,peer=%q,path=\"%d\"", dev, p.Peer.String(), p.Path)
		failed := 0
		if p.Failed {
			failed = 1
		}
		fmt.Fprintf(w, "softefa_path_srtt_seconds{%s} %g\nsoftefa_path_sent_packets{%s} %d\n"+
			"softefa_path_lost_packets{%s} %d\nsoftefa_path_failed{%s} %d\n",
			l, p.SRTT.Seconds(), l, p.Sent, l, p.Lost, l, failed)
	}
}

// serveMetrics serves /metrics on addr while the returned function is not called.
func serveMetrics(addr string, e *endpoint) func() {
	if addr == "" {
		return func() {}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softefa: metrics:", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		writeMetrics(w, e)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	fmt.Fprintf(os.Stderr, "softefa: metrics on http://%s/metrics\n", ln.Addr())
	return func() { _ = srv.Shutdown(context.Background()) }
}
