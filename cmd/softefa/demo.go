package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// demoOp is one row of the demo: run does work request i of size bytes from a to b, checks
// that it landed, and returns how long the transfer took, from the post to the completions that
// end it (preparing the data and checking it are not timed).
type demoOp struct {
	name string
	run  func(a, b *endpoint, i, size int) (time.Duration, error)
}

const demoTimeout = 10 * time.Second

func runDemo(args []string) error { return demo(args, os.Stdout) }

// demo runs the demo with args, printing its table to out.
func demo(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	iters := fs.Int("n", 1000, "work requests per operation (the large RDMA ones: a hundredth, at least 1)")
	size := fs.Int("s", 4096, "message size in bytes, 4 to 8192 (SEND ≤ the 8 KiB MTU)")
	rdma := fs.Int("rdma", 1<<20, "RDMA transfer size in bytes, 4 bytes to 1 GiB")
	same := fs.Bool("same-device", false, "run both ends on one device (no network)")
	addr := fs.String("addr", "127.0.0.1:0", "UDP address the two devices bind, each on a free port: give port 0")
	paths := fs.Int("paths", 4, "paths (UDP source ports) per device, 1 to 255")
	pathMTU := fs.Int("mtu", 0, "path MTU: SRD segments fit it, 576 to 65535 (0: 9001 on loopback, else 1500)")
	if err := parseFlags(fs, "softefa demo [flags]", args); err != nil {
		return err
	}
	set := setFlags(fs)
	switch {
	case *size > maxSendSize || *size < 4:
		return fmt.Errorf("-s %d: SEND messages are 4 to 8192 bytes", *size)
	case *iters < 1:
		return fmt.Errorf("-n %d: must be positive", *iters)
	case *rdma < 4 || *rdma > maxRDMASize:
		return fmt.Errorf("--rdma %d: 4 bytes to 1 GiB", *rdma)
	case *paths < 1 || *paths > 255:
		return fmt.Errorf("--paths %d: 1 to 255 paths", *paths)
	case *pathMTU != 0 && (*pathMTU < 576 || *pathMTU > 65535):
		return fmt.Errorf("--mtu %d: a path MTU is 576 to 65535 (0: the default)", *pathMTU)
	case *same && set["addr"]:
		return errors.New("--addr with --same-device: one device with no network has no address")
	case *same && (set["paths"] || set["mtu"]):
		return errors.New("--paths and --mtu with --same-device: one device with no network has no paths")
	}
	if !*same {
		ap, err := parseAddr(*addr)
		if err != nil {
			return fmt.Errorf("--addr %q: %w", *addr, err)
		}
		if ap.Port() != 0 {
			return fmt.Errorf("--addr %s: the demo's two devices need a port each; give port 0", *addr)
		}
	}
	// Two devices on UDP sockets, or one device with two contexts (-same-device).
	var a, b *endpoint
	// One goroutine plays both sides: it sleeps on completion events when a transfer takes longer
	// than a spin (endpoint.sleepAfter); at once with one Go processor, where the other device
	// runs only while this goroutine sleeps.
	sleepAfter := 50 * time.Microsecond
	if runtime.GOMAXPROCS(0) == 1 {
		sleepAfter = time.Nanosecond
	}
	ec := endpointConfig{typ: verbs.QPTDriver, qps: 1, bufSize: max(*rdma, *size), depth: 256, paths: *paths, pathMTU: *pathMTU,
		events: true, sleepAfter: sleepAfter}
	var err error
	if *same {
		dev, derr := verbs.NewDevice(config.Device{Name: "efa_demo"})
		if derr != nil {
			return derr
		}
		defer dev.Close()
		if a, err = endpointOn(dev, ec); err == nil {
			b, err = endpointOn(dev, ec)
		}
	} else {
		ec.addr = *addr
		if a, err = newEndpoint(ec); err == nil {
			b, err = newEndpoint(ec)
		}
	}
	for _, e := range []*endpoint{a, b} {
		if e != nil {
			defer e.close()
		}
	}
	if err != nil {
		return err
	}
	if err := a.connect(b.dev.GID()); err != nil {
		return err
	}
	if err := b.connect(a.dev.GID()); err != nil {
		return err
	}
	if *same {
		fmt.Fprintf(out, "softefa demo: device %s, GID %v, QP %d -> QP %d (same device, two contexts)\n",
			a.dev.Name(), a.dev.GID(), a.qps[0].QPN(), b.qps[0].QPN())
	} else {
		fmt.Fprintf(out, "softefa demo: SRD over UDP, %d paths, path MTU %d\n  %v QP %d  ->  %v QP %d\n",
			*paths, a.dev.PathMTU(), a.dev.Addr(), a.qps[0].QPN(), b.dev.Addr(), b.qps[0].QPN())
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tWRs\tbytes/WR\ttotal µs\tµs/WR\tMB/s\tchecked\t")
	for _, op := range demoOps() {
		n, sz := *iters, *size
		if op.name == "RDMA_WRITE (large)" || op.name == "RDMA_READ (large)" {
			n, sz = max(*iters/100, 1), *rdma
		}
		var el time.Duration
		for i := range n {
			took, err := op.run(a, b, i, sz)
			if err != nil {
				tw.Flush()
				return fmt.Errorf("%s #%d: %w", op.name, i, err)
			}
			el += took
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.1f\tyes\t\n", op.name, n, sz, float64(el.Microseconds()),
			float64(el.Nanoseconds())/float64(n)/1e3, float64(n*sz)/el.Seconds()/1e6)
	}
	tw.Flush()
	c := a.ctx.Counters()
	fmt.Fprintf(out, "requester: send_wrs %d rdma_write_wrs %d rdma_read_wrs %d tx_pkts %d rx_pkts %d retrans_pkts %d, errors 0\n",
		c.SendWRs, c.RDMAWriteWRs, c.RDMAReadWRs, c.TxPkts, c.RxPkts, c.RetransPkts)
	return nil
}

// fillSeq writes a pattern seeded by i and returns its CRC32.
func fillSeq(b []byte, i int) uint32 {
	r := rand.NewPCG(uint64(i), 0x5eed)
	for j := 0; j+8 <= len(b); j += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[j+k] = byte(v >> (8 * k))
		}
	}
	return crc32.ChecksumIEEE(b)
}

func sendOp(withImm bool) func(a, b *endpoint, i, size int) (time.Duration, error) {
	return func(a, b *endpoint, i, size int) (time.Duration, error) {
		if err := b.recv(b.qps[0], uint64(i), 0, size); err != nil {
			return 0, err
		}
		sum := fillSeq(a.buf[:size], i)
		start := time.Now()
		if err := a.post(a.qps[0], uint64(i), b.qps[0].QPN(), func(x *verbs.QPEx) {
			if withImm {
				x.WRSendImm(uint32(i))
			} else {
				x.WRSend()
			}
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(size))
		}); err != nil {
			return 0, err
		}
		if err := a.await(verbs.WCSend, demoTimeout, nil); err != nil {
			return 0, err
		}
		var got verbs.WC
		if err := b.await(verbs.WCRecv, demoTimeout, func(wc verbs.WC) error { got = wc; return nil }); err != nil {
			return 0, err
		}
		took := time.Since(start)
		if int(got.ByteLen) != size || crc32.ChecksumIEEE(b.buf[:size]) != sum || withImm && got.ImmData != uint32(i) {
			return 0, fmt.Errorf("received %d bytes, imm %d: data or immediate differ", got.ByteLen, got.ImmData)
		}
		return took, nil
	}
}

func rdmaOp(read, withImm bool) func(a, b *endpoint, i, size int) (time.Duration, error) {
	return func(a, b *endpoint, i, size int) (time.Duration, error) {
		sum := fillSeq(a.buf[:size], i)
		if read {
			// The READ's source is put in place by an RDMA WRITE, not written by this goroutine:
			// the target's device may send a READ's data again after the requester has it all
			// (a packet it counted lost), reading the source on its own goroutine, and only the
			// device itself writes it in step with that. What the READ brings lands where the
			// pattern was, cleared first.
			if err := a.post(a.qps[0], uint64(i), b.qps[0].QPN(), func(x *verbs.QPEx) {
				x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
				x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(size))
			}); err != nil {
				return 0, err
			}
			if err := a.await(verbs.WCRDMAWrite, demoTimeout, nil); err != nil {
				return 0, err
			}
			clear(a.buf[:size])
		}
		if withImm {
			if err := b.recv(b.qps[0], uint64(i), 0, 0); err != nil {
				return 0, err
			}
		}
		start := time.Now()
		if err := a.post(a.qps[0], uint64(i), b.qps[0].QPN(), func(x *verbs.QPEx) {
			switch {
			case read:
				x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
			case withImm:
				x.WRRDMAWriteImm(b.mr.RKey(), b.mr.Addr(), uint32(i))
			default:
				x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
			}
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(size))
		}); err != nil {
			return 0, err
		}
		op := verbs.WCRDMAWrite
		if read {
			op = verbs.WCSend // libefa reports reads as SEND
		}
		if err := a.await(op, demoTimeout, nil); err != nil {
			return 0, err
		}
		var imm verbs.WC
		if withImm {
			if err := b.await(verbs.WCRecvRDMAWithImm, demoTimeout, func(wc verbs.WC) error { imm = wc; return nil }); err != nil {
				return 0, err
			}
		}
		took := time.Since(start)
		got := a.buf[:size]
		switch {
		case read:
		case !withImm: // read it back to see it landed: b's memory is b's to look at
			return took, readBack(a, b, i, size, sum)
		case imm.ImmData != uint32(i) || int(imm.ByteLen) != size:
			return 0, fmt.Errorf("write-with-imm completion %+v", imm)
		default:
			got = b.buf[:size]
		}
		if crc32.ChecksumIEEE(got) != sum {
			return 0, errors.New("data differs after the transfer")
		}
		return took, nil
	}
}

// readBack reads b's region into the upper half of a's buffer and compares.
func readBack(a, b *endpoint, i, size int, sum uint32) error {
	off := len(a.buf) - size
	if err := a.post(a.qps[0], uint64(i), b.qps[0].QPN(), func(x *verbs.QPEx) {
		x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
		x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+uint64(off), uint32(size))
	}); err != nil {
		return err
	}
	if err := a.await(verbs.WCSend, demoTimeout, nil); err != nil {
		return err
	}
	if crc32.ChecksumIEEE(a.buf[off:off+size]) != sum {
		return errors.New("RDMA write: data read back differs")
	}
	return nil
}

func demoOps() []demoOp {
	return []demoOp{
		{"SEND", sendOp(false)},
		{"SEND_WITH_IMM", sendOp(true)},
		{"RDMA_WRITE", rdmaOp(false, false)},
		{"RDMA_WRITE_WITH_IMM", rdmaOp(false, true)},
		{"RDMA_READ", rdmaOp(true, false)},
		{"RDMA_WRITE (large)", rdmaOp(false, false)},
		{"RDMA_READ (large)", rdmaOp(true, false)},
	}
}
