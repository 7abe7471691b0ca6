//go:build linux

package uverbs

import (
	"syscall"
	"testing"

	"github.com/softefa/softefa/internal/uapi"
)

func nlReq(cmd, flags uint16, seq uint32, attrs func([]byte) []byte) []byte {
	b := nlHeader(nlClientNLDEV<<10|cmd, nlmFRequest|flags, seq, 0)
	if attrs != nil {
		b = attrs(b)
	}
	return nlFinish(b)
}

func devIdx(b []byte) []byte { return nlaU32(b, nlaDevIndex, 0) }

// nlParse returns the top-level attributes of a reply and its type and flags.
func nlParse(t *testing.T, msg []byte) (uint16, uint16, map[uint16][]byte) {
	t.Helper()
	if int(u32(msg, 0)) != len(msg) {
		t.Fatalf("length %d in a %d-byte message", u32(msg, 0), len(msg))
	}
	if u16(msg, 4) == nlmsgError || u16(msg, 4) == nlmsgDone {
		return u16(msg, 4), u16(msg, 6), nil
	}
	a, err := nlAttrs(msg)
	if err != 0 {
		t.Fatalf("reply attributes: %v", err)
	}
	return u16(msg, 4), u16(msg, 6), a
}

func nestedEntries(t *testing.T, b []byte) []map[uint16][]byte {
	var out []map[uint16][]byte
	for len(b) >= 4 {
		n := int(u16(b, 0))
		inner, err := nlAttrs(append(make([]byte, nlmsgHdrLen), b[4:n]...))
		if err != 0 {
			t.Fatal(err)
		}
		out = append(out, inner)
		b = b[nlmAlign(n):]
	}
	return out
}

// TestNetlink: the NLDEV commands iproute2's rdma tool and libibverbs send get the kernel's
// answers for one device with one ACTIVE port and no netdev; dumps end with NLMSG_DONE; errors
// carry -errno.
func TestNetlink(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	h.regMR(pd, 1)
	ch := Chardev{Name: "uverbs_softefa0", Major: 231, Minor: 250}

	out := h.d.Netlink(nlReq(nldevCmdGet, nlmFDump, 7, nil), 42, ch)
	if len(out) != 2 {
		t.Fatalf("GET dump: %d messages", len(out))
	}
	typ, flags, a := nlParse(t, out[0])
	if typ != nlClientNLDEV<<10|nldevCmdGet || flags&nlmFMulti == 0 || u32(out[0], 8) != 7 || u32(out[0], 12) != 42 {
		t.Fatalf("GET dump header % x", out[0][:16])
	}
	if string(trimNUL(a[nlaDevName])) != h.d.cfg.Name || u64(a[nlaNodeGUID], 0) != h.d.GUID() ||
		u32(a[nlaPortIndex], 0) != 1 || a[nlaDevNodeType][0] != 7 { // RDMA_NODE_UNSPECIFIED, as on EFA
		t.Fatalf("GET attributes %v", a)
	}
	if typ, _, _ := nlParse(t, out[1]); typ != nlmsgDone {
		t.Fatalf("dump ends with type %d", typ)
	}

	out = h.d.Netlink(nlReq(nldevCmdPortGet, nlmFDump, 8, devIdx), 42, ch)
	_, _, a = nlParse(t, out[0])
	if a[nlaPortState][0] != uapi.PortActive || a[nlaPortPhysState][0] != uapi.PhysStateLinkUp {
		t.Fatalf("port %v", a)
	}
	if _, ok := a[nlaNdevName]; ok {
		t.Fatal("a netdev: EFA has none")
	}

	out = h.d.Netlink(nlReq(nldevCmdGetChardev, 0, 9, func(b []byte) []byte {
		return nlaStr(devIdx(b), nlaChardevType, "uverbs")
	}), 42, ch)
	if len(out) != 1 {
		t.Fatalf("GET_CHARDEV: %d messages", len(out))
	}
	_, _, a = nlParse(t, out[0])
	v := u64(a[nlaChardev], 0)
	if string(trimNUL(a[nlaChardevName])) != ch.Name || (v&0xfff00)>>8 != 231 || v&0xff|(v>>12)&0xfff00 != 250 ||
		u64(a[nlaChardevABI], 0) != EFAABIVersion || u32(a[nlaUverbsDriverID], 0) != rdmaDriverEFA {
		t.Fatalf("GET_CHARDEV %v", a)
	}

	out = h.d.Netlink(nlReq(nldevCmdSysGet, nlmFAck, 10, nil), 42, ch)
	if len(out) != 2 {
		t.Fatalf("SYS_GET with ACK: %d messages", len(out))
	}
	_, _, a = nlParse(t, out[0])
	if a[nlaSysCopyOnFork][0] != 1 {
		t.Fatalf("SYS_GET %v", a)
	}
	if typ, _, _ := nlParse(t, out[1]); typ != nlmsgError || u32(out[1], 16) != 0 {
		t.Fatalf("ACK % x", out[1])
	}

	out = h.d.Netlink(nlReq(nldevCmdResGet, nlmFDump, 11, nil), 42, ch)
	_, _, a = nlParse(t, out[0])
	got := map[string]uint64{}
	for _, e := range nestedEntries(t, a[nlaResSummary]) {
		got[string(trimNUL(e[nlaResSummaryName]))] = u64(e[nlaResSummaryCurr], 0)
	}
	if got["pd"] != 1 || got["mr"] != 1 || got["ctx"] != 1 || got["qp"] != 0 {
		t.Fatalf("resource summary %v", got)
	}

	out = h.d.Netlink(nlReq(nldevCmdStatGet, 0, 12, func(b []byte) []byte {
		return nlaU32(devIdx(b), nlaPortIndex, 1)
	}), 42, ch)
	_, _, a = nlParse(t, out[0])
	names := map[string]bool{}
	for _, e := range nestedEntries(t, a[nlaStatHWCounters]) {
		names[string(trimNUL(e[nlaStatHWCounterName]))] = true
	}
	for _, n := range []string{"tx_bytes", "rx_pkts", "send_wrs", "rdma_read_bytes", "retrans_timeout_events"} {
		if !names[n] {
			t.Errorf("hw counter %s missing (have %v)", n, names)
		}
	}

	for _, c := range []struct {
		req  []byte
		want syscall.Errno
	}{
		{nlReq(nldevCmdGet, 0, 1, nil), syscall.EINVAL},                                                        // a GET needs the index
		{nlReq(nldevCmdGet, 0, 1, func(b []byte) []byte { return nlaU32(b, nlaDevIndex, 3) }), syscall.EINVAL}, // another device
		{nlReq(nldevCmdPortGet, nlmFDump, 1, nil), syscall.EINVAL},
		{nlReq(nldevCmdGetChardev, 0, 1, func(b []byte) []byte { return nlaStr(devIdx(b), nlaChardevType, "umad") }), syscall.EOPNOTSUPP},
		{nlReq(63, 0, 1, nil), syscall.EOPNOTSUPP},
	} {
		out := h.d.Netlink(c.req, 42, ch)
		if len(out) != 1 || u16(out[0], 4) != nlmsgError || int32(u32(out[0], 16)) != -int32(c.want) {
			t.Errorf("request % x: got %d messages, first % x; want error %v", c.req, len(out), out[0], c.want)
		}
	}
	// Two requests in one send get their answers in order; a message without NLM_F_REQUEST none.
	two := append(nlReq(nldevCmdSysGet, 0, 1, nil), nlReq(nldevCmdSysGet, 0, 2, nil)...)
	notReq := nlFinish(nlHeader(nlClientNLDEV<<10|nldevCmdSysGet, 0, 3, 0))
	out = h.d.Netlink(append(two, notReq...), 42, ch)
	if len(out) != 2 || u32(out[0], 8) != 1 || u32(out[1], 8) != 2 {
		t.Fatalf("batched requests: %d replies", len(out))
	}
}
