//go:build linux

package uverbs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/softefa/softefa/internal/uapi"
)

// FuzzUverbsWrite feeds arbitrary bytes to the command decoder of a File that has a context, a
// PD (handle 0) and a CQ (handle 1), with response buffers at respAddr. Every write must return
// the whole count or an errno, never panic; Close must then free every region.
func FuzzUverbsWrite(f *testing.F) {
	_, d := fuzzDevice(f)

	drv := make([]byte, 8)
	put32(drv, 0, efaAllocUcontextCmdTxBatch|efaAllocUcontextCmdMinSQWR)
	f.Add(cmd(cmdQueryDevice, 44, withResp(8), nil))
	port := withResp(16)
	port[8] = 1
	f.Add(cmd(cmdQueryPort, 10, port, nil))
	f.Add(cmd(cmdAllocPD, 3, withResp(8), nil))
	cq, cqd := createCQCmd(8, 32, 0)
	f.Add(cmd(cmdCreateCQ, 12, cq, cqd))
	qp := withResp(createQPReq)
	put32(qp, 20, 1)
	put32(qp, 24, 1)
	put32(qp, 32, 16)
	qp[53] = uapi.QPTypeDriver
	qpd := make([]byte, 16)
	put32(qpd, 4, 256)
	put32(qpd, 8, 1024)
	f.Add(cmd(cmdCreateQP, 24, qp, qpd))
	ex := make([]byte, hdrSize+exHdrSize+8)
	put32(ex, 0, cmdFlagExtended|cmdQueryDevice)
	put16(ex, 4, 1)
	put16(ex, 6, 38)
	put64(ex, 8, respAddr)
	put16(ex, 18, 3)
	f.Add(ex)
	mod := make([]byte, modifyQPReq)
	put32(mod, 68, 1|1<<4|1<<5|1<<6)
	mod[96], mod[104] = 1, 1
	f.Add(cmd(cmdModifyQP, 0, mod, nil))

	f.Fuzz(func(t *testing.T, b []byte) {
		mem := &fakeMem{segs: map[uint64][]byte{respAddr: make([]byte, 4096), bufAddr: make([]byte, 65536)}}
		reg := &heapRegions{}
		file := d.Open(mem, reg, nil)
		setup := [][]byte{
			cmd(cmdGetContext, 8, withResp(8), drv),
			cmd(cmdAllocPD, 3, withResp(8), nil),
			cmd(cmdCreateCQ, 12, cq, cqd),
		}
		for _, s := range setup {
			if _, err := file.Write(s); err != nil {
				t.Fatalf("setup: %v", err)
			}
			if s[0] == cmdGetContext {
				syscall.Close(int(u32(mem.segs[respAddr], 0)))
			}
		}
		n, err := file.Write(b)
		var errno syscall.Errno
		switch {
		case err == nil && n != len(b):
			t.Fatalf("Write returned %d for %d bytes", n, len(b))
		case err != nil && !errors.As(err, &errno):
			t.Fatalf("Write error without an errno: %v", err)
		}
		if err == nil && len(b) >= hdrSize && u32(b, 0) == cmdCreateCompChannel {
			syscall.Close(int(u32(mem.segs[respAddr], 0)))
		}
		_ = file.Close()
		if len(reg.live) != 0 {
			t.Fatalf("%d regions live after Close", len(reg.live))
		}
	})
}
