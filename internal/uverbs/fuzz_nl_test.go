//go:build linux

package uverbs

import (
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
)

// FuzzNetlink feeds arbitrary bytes to the RDMA netlink server as one send. It must never
// panic, and every reply must be a well-formed netlink message whose length field is its size.
func FuzzNetlink(f *testing.F) {
	_, d := fuzzDevice(f)
	ch := Chardev{Name: "uverbs_softefa0", Major: 231, Minor: 250}
	f.Add(nlReq(nldevCmdGet, nlmFDump, 1, nil))
	f.Add(nlReq(nldevCmdPortGet, nlmFDump|nlmFAck, 2, devIdx))
	f.Add(nlReq(nldevCmdGetChardev, 0, 3, func(b []byte) []byte { return nlaStr(devIdx(b), nlaChardevType, "uverbs") }))
	f.Add(nlReq(nldevCmdStatGet, 0, 4, func(b []byte) []byte { return nlaU32(devIdx(b), nlaPortIndex, 1) }))
	f.Add(nlReq(nldevCmdResQPGet, nlmFDump, 5, devIdx))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, msg := range d.Netlink(b, 7, ch) {
			if len(msg) < nlmsgHdrLen || int(u32(msg, 0)) != len(msg) {
				t.Fatalf("malformed reply % x", msg)
			}
		}
	})
}

// FuzzIoctl feeds arbitrary header and attribute bytes to the ioctl interface of a File with a
// context, a PD and an MR. It must never panic, and must answer an errno or success.
func FuzzIoctl(f *testing.F) {
	e, d := fuzzDevice(f)
	seed := func(object, method uint16, attrs []ioctlAttrIn) []byte {
		return putIoctl(make([]byte, ioctlHdrSize+len(attrs)*ioctlAttrSize), object, method, attrs)
	}
	f.Add(seed(uverbsObjectMR, efaMethodMRQuery, mrQueryAttrs(1))) // PD 0, MR 1
	f.Add(seed(0, 1, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 2048 {
			b = b[:2048]
		}
		mem := &fakeMem{segs: map[uint64][]byte{respAddr: make([]byte, 4096), bufAddr: make([]byte, 65536)}}
		h := &harness{t: t, e: e, d: d, mem: mem, reg: &heapRegions{}}
		h.f = d.Open(mem, h.reg, nil)
		defer h.f.Close()
		h.getContext()
		h.regMR(h.allocPD(), 1)
		copy(mem.segs[respAddr][2048:], b)
		_ = h.f.Ioctl(rdmaVerbsIoctl, ioctlAddr)
	})
}

// fuzzDevice makes an engine device and the uverbs device on it, closed when the fuzz target ends.
func fuzzDevice(f *testing.F) (*engine.Device, *Device) {
	e, err := engine.NewDevice(config.Device{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	d := NewDevice(e)
	f.Cleanup(func() { d.Close() })
	return e, d
}
