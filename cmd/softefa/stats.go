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

// metricsServer serves an endpoint's counters on /metrics. Its listener opens at the start,
// so that a busy address is refused at once; it serves once the endpoint exists.
type metricsServer struct {
	ln  net.Listener
	srv *http.Server
}

// listenMetrics opens addr for metrics; no address, no server (a nil *metricsServer does nothing).
func listenMetrics(addr string) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	return &metricsServer{ln: ln}, nil
}

// serve serves e's counters until stop.
func (m *metricsServer) serve(e *endpoint) {
	if m == nil || m.srv != nil {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		writeMetrics(w, e)
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go m.srv.Serve(m.ln)
	fmt.Fprintf(os.Stderr, "softefa: metrics on http://%s/metrics\n", m.ln.Addr())
}

// stop ends serving, waiting for requests under way (they read the endpoint), and closes the
// listener.
func (m *metricsServer) stop() {
	if m == nil {
		return
	}
	if m.srv != nil {
		_ = m.srv.Shutdown(context.Background())
	}
	_ = m.ln.Close()
}
