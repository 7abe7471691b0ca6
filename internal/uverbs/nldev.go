//go:build linux

package uverbs

import (
	"os"
	"sort"
	"syscall"

	"github.com/softefa/softefa/internal/uapi"
)

// Netlink answers the RDMA netlink (NETLINK_RDMA) requests in req, one or more netlink messages
// as a program sent them on its socket, the way the kernel's NLDEV client does for one device
// with one port (docs/cabi.md, "Netlink"). It returns the datagrams the program then reads, in
// order: for a dump, one message per object flagged NLM_F_MULTI and an NLMSG_DONE; for a request,
// the reply; for a failure, an NLMSG_ERROR carrying -errno and the request; with NLM_F_ACK, an
// NLMSG_ERROR of 0 after a successful request. portID is the socket's port, which replies carry.
//
// ch describes the uverbs character device (its name, dev_t) that GET_CHARDEV reports.
func (d *Device) Netlink(req []byte, portID uint32, ch Chardev) [][]byte {
	var out [][]byte
	for len(req) >= nlmsgHdrLen {
		n := int(u32(req, 0))
		if n < nlmsgHdrLen || n > len(req) {
			break // netlink_rcv_skb: a truncated message ends the batch silently
		}
		msg := req[:n]
		req = req[min(nlmAlign(n), len(req)):]
		flags := u16(msg, 6)
		if flags&nlmFRequest == 0 {
			continue
		}
		replies, err := d.nlRequest(msg, portID, ch)
		if err != 0 {
			out = append(out, nlError(msg, portID, err))
			continue
		}
		out = append(out, replies...)
		if flags&nlmFAck != 0 && !(flags&nlmFDump != 0 && isDump(u16(msg, 4))) {
			out = append(out, nlError(msg, portID, 0))
		}
	}
	return out
}

// Chardev is what GET_CHARDEV reports for the "uverbs" client.
type Chardev struct {
	Name         string // the node's name under /dev/infiniband
	Major, Minor uint32
}

func nlmAlign(n int) int { return (n + 3) &^ 3 }

func isDump(typ uint16) bool {
	switch typ & 0x3ff {
	case nldevCmdGet, nldevCmdPortGet, nldevCmdResGet, nldevCmdResQPGet, nldevCmdResCQGet,
		nldevCmdResMRGet, nldevCmdResPDGet, nldevCmdStatGet:
		return true
	}
	return false
}

// nlError builds an NLMSG_ERROR for msg: error (-errno, or 0 for an ACK) and the request's header,
// with the whole request after it for an error (no NETLINK_CAP_ACK), as netlink_ack does; an
// ACK, which carries the header alone, is flagged NLM_F_CAPPED.
func nlError(msg []byte, portID uint32, errno syscall.Errno) []byte {
	body, flags := msg[:nlmsgHdrLen], uint16(nlmFCapped)
	if errno != 0 {
		body, flags = msg, 0
	}
	b := nlHeader(nlmsgError, flags, u32(msg, 8), portID)
	e := make([]byte, 4)
	put32(e, 0, uint32(-int32(errno)))
	b = append(b, e...)
	b = append(b, body...)
	return nlFinish(b)
}

func nlHeader(typ, flags uint16, seq, portID uint32) []byte {
	b := make([]byte, nlmsgHdrLen, 256)
	put16(b, 4, typ)
	put16(b, 6, flags)
	put32(b, 8, seq)
	put32(b, 12, portID)
	return b
}

// nlFinish writes the message's length into its header.
func nlFinish(b []byte) []byte {
	put32(b, 0, uint32(len(b)))
	return b
}

// attribute encoders: type, length, payload, padding to 4 bytes.
func nlaPut(b []byte, typ uint16, payload []byte) []byte {
	var h [4]byte
	put16(h[:], 0, uint16(4+len(payload)))
	put16(h[:], 2, typ)
	b = append(b, h[:]...)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func nlaU8(b []byte, typ uint16, v uint8) []byte { return nlaPut(b, typ, []byte{v}) }

func nlaU32(b []byte, typ uint16, v uint32) []byte {
	p := make([]byte, 4)
	put32(p, 0, v)
	return nlaPut(b, typ, p)
}

func nlaU64(b []byte, typ uint16, v uint64) []byte {
	p := make([]byte, 8)
	put64(p, 0, v)
	return nlaPut(b, typ, p)
}

func nlaStr(b []byte, typ uint16, s string) []byte { return nlaPut(b, typ, append([]byte(s), 0)) }

// nlaNest appends a nested attribute whose contents fill writes.
func nlaNest(b []byte, typ uint16, fill func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = fill(b)
	put16(b, start, uint16(len(b)-start))
	put16(b, start+2, typ|nlaFNested)
	return b
}

// nlAttrs parses the attributes after the request's header; a malformed one is EINVAL
// (nlmsg_parse_deprecated).
func nlAttrs(msg []byte) (map[uint16][]byte, syscall.Errno) {
	attrs := make(map[uint16][]byte)
	b := msg[nlmsgHdrLen:]
	for len(b) >= 4 {
		n := int(u16(b, 0))
		if n < 4 || n > len(b) {
			return nil, syscall.EINVAL
		}
		typ := u16(b, 2) & nlaTypeMask
		if typ > nlaMax {
			return nil, syscall.EINVAL
		}
		attrs[typ] = b[4:n]
		b = b[min(nlmAlign(n), len(b)):]
	}
	return attrs, 0
}

// nlU32 reads a u32 attribute; ok is false when it is absent or too short.
func nlU32(attrs map[uint16][]byte, typ uint16) (uint32, bool) {
	v, ok := attrs[typ]
	if !ok || len(v) < 4 {
		return 0, false
	}
	return u32(v, 0), true
}

// nlDevIndex is the one device's index (the kernel numbers devices from 0... per namespace; a
// process here has one device).
const nlDevIndex = 0

func (d *Device) nlRequest(msg []byte, portID uint32, ch Chardev) ([][]byte, syscall.Errno) {
	typ := u16(msg, 4)
	if typ>>10 != nlClientNLDEV {
		return nil, syscall.EINVAL // rdma_nl_rcv_msg: a client without this op
	}
	attrs, err := nlAttrs(msg)
	if err != 0 {
		return nil, err
	}
	seq := u32(msg, 8)
	dump := u16(msg, 6)&nlmFDump != 0 && isDump(typ)
	one := func(fill func([]byte) []byte) [][]byte {
		flags := uint16(0)
		if dump {
			flags = nlmFMulti
		}
		out := [][]byte{nlFinish(fill(nlHeader(typ, flags, seq, portID)))}
		if dump {
			done := nlHeader(nlmsgDone, nlmFMulti, seq, portID)
			done = append(done, 0, 0, 0, 0)
			out = append(out, nlFinish(done))
		}
		return out
	}
	// A request naming a device must name this one (ib_device_get_by_index: EINVAL otherwise).
	idx, hasIdx := nlU32(attrs, nlaDevIndex)
	if hasIdx && idx != nlDevIndex {
		return nil, syscall.EINVAL
	}
	switch typ & 0x3ff {
	case nldevCmdGet:
		if !dump && !hasIdx {
			return nil, syscall.EINVAL
		}
		return one(d.nlDevInfo), 0
	case nldevCmdPortGet:
		if !hasIdx {
			return nil, syscall.EINVAL // nldev_port_get_dumpit needs the device too
		}
		port, hasPort := nlU32(attrs, nlaPortIndex)
		if !dump && (!hasPort || port != 1) || dump && hasPort && port != 1 {
			return nil, syscall.EINVAL
		}
		return one(d.nlPortInfo), 0
	case nldevCmdSysGet:
		return one(func(b []byte) []byte {
			b = nlaU8(b, nlaSysNetnsMode, 1)     // shared
			b = nlaU8(b, nlaSysPrivQKeyMode, 0)  // not allowed
			return nlaU8(b, nlaSysCopyOnFork, 1) // the kernel copies DMA pages on fork
		}), 0
	case nldevCmdGetChardev:
		name, ok := attrs[nlaChardevType]
		if !ok {
			return nil, syscall.EINVAL
		}
		if string(trimNUL(name)) != "uverbs" {
			return nil, syscall.EOPNOTSUPP // ib_get_client_nl_info: no such client
		}
		if !hasIdx {
			return nil, syscall.EINVAL // uverbs is a per-device client
		}
		return [][]byte{nlFinish(d.nlChardev(nlHeader(typ, 0, seq, portID), ch))}, 0
	case nldevCmdResGet:
		if !dump && !hasIdx {
			return nil, syscall.EINVAL
		}
		return one(d.nlResSummary), 0
	case nldevCmdResQPGet, nldevCmdResCQGet, nldevCmdResMRGet, nldevCmdResPDGet:
		if !hasIdx {
			return nil, syscall.EINVAL
		}
		return d.nlResList(typ, seq, portID, dump), 0
	case nldevCmdStatGet:
		if !hasIdx {
			return nil, syscall.EINVAL
		}
		if port, ok := nlU32(attrs, nlaPortIndex); !ok || port != 1 {
			return nil, syscall.EINVAL
		}
		if _, ok := attrs[nlaStatRes]; ok {
			return nil, syscall.EOPNOTSUPP // per-QP counters: counter binding is not emulated
		}
		return one(d.nlHWCounters), 0
	}
	return nil, syscall.EOPNOTSUPP
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

func (d *Device) nlDevHandle(b []byte) []byte {
	b = nlaU32(b, nlaDevIndex, nlDevIndex)
	return nlaStr(b, nlaDevName, d.cfg.Name)
}

// nlDevInfo is fill_dev_info: EFA reports no protocol (it is neither IB, RoCE nor iWARP).
func (d *Device) nlDevInfo(b []byte) []byte {
	b = d.nlDevHandle(b)
	b = nlaU32(b, nlaPortIndex, 1) // the last port
	b = nlaU64(b, nlaCapFlags, 0)
	b = nlaStr(b, nlaFWVersion, "0.0.0.0")
	b = nlaU64(b, nlaNodeGUID, d.guid)
	b = nlaU64(b, nlaSysImageGUID, d.guid)
	b = nlaU8(b, nlaDevNodeType, rdmaNodeUnspecified)
	return nlaU8(b, nlaDevDIM, 0)
}

// nlPortInfo is fill_port_info for a port that is not IB: its state only, and no netdev (an EFA
// device has none).
func (d *Device) nlPortInfo(b []byte) []byte {
	b = d.nlDevHandle(b)
	b = nlaU32(b, nlaPortIndex, 1)
	b = nlaU8(b, nlaPortState, uapi.PortActive)
	return nlaU8(b, nlaPortPhysState, uapi.PhysStateLinkUp)
}

func (d *Device) nlChardev(b []byte, ch Chardev) []byte {
	// new_encode_dev, as the kernel reports a dev_t.
	dev := uint64(ch.Minor&0xff) | uint64(ch.Major)<<8 | uint64(ch.Minor&^0xff)<<12
	b = nlaU64(b, nlaChardev, dev)
	b = nlaU64(b, nlaChardevABI, EFAABIVersion)
	b = nlaStr(b, nlaChardevName, ch.Name)
	return nlaU32(b, nlaUverbsDriverID, rdmaDriverEFA)
}

// resources is a snapshot of every object of every open File, by kind.
type resources struct {
	pds []*pdObj
	mrs []*mrObj
	cqs []*cqObj
	qps []*qpObj
	ctx int
}

func (d *Device) resources() resources {
	d.mu.Lock()
	files := make([]*File, 0, len(d.files))
	for f := range d.files {
		files = append(files, f)
	}
	d.mu.Unlock()
	var r resources
	for _, f := range files {
		f.mu.Lock()
		if f.hasCtx && !f.closed {
			r.ctx++
		}
		for _, o := range f.objs {
			switch o := o.(type) {
			case *pdObj:
				r.pds = append(r.pds, o)
			case *mrObj:
				r.mrs = append(r.mrs, o)
			case *cqObj:
				r.cqs = append(r.cqs, o)
			case *qpObj:
				r.qps = append(r.qps, o)
			}
		}
		f.mu.Unlock()
	}
	sort.Slice(r.qps, func(i, j int) bool { return r.qps[i].qp.QPN() < r.qps[j].qp.QPN() })
	sort.Slice(r.pds, func(i, j int) bool { return r.pds[i].pd.PDN() < r.pds[j].pd.PDN() })
	sort.Slice(r.mrs, func(i, j int) bool { return r.mrs[i].mr.LKey() < r.mrs[j].mr.LKey() })
	return r
}

// nlResSummary is fill_res_info: the count of each kind of object.
func (d *Device) nlResSummary(b []byte) []byte {
	r := d.resources()
	b = d.nlDevHandle(b)
	return nlaNest(b, nlaResSummary, func(b []byte) []byte {
		for _, e := range []struct {
			name string
			n    int
		}{{"pd", len(r.pds)}, {"cq", len(r.cqs)}, {"qp", len(r.qps)}, {"cm_id", 0}, {"mr", len(r.mrs)},
			{"ctx", r.ctx}, {"srq", 0}} {
			b = nlaNest(b, nlaResSummaryEntry, func(b []byte) []byte {
				b = nlaStr(b, nlaResSummaryName, e.name)
				return nlaU64(b, nlaResSummaryCurr, uint64(e.n))
			})
		}
		return b
	})
}

// nlResList answers RES_{QP,CQ,MR,PD}_GET: a dump lists every object of the kind, each in its
// own message (as res_get_common_dumpit does), owned by this process.
func (d *Device) nlResList(typ uint16, seq, portID uint32, dump bool) [][]byte {
	r := d.resources()
	pid := uint32(os.Getpid())
	var entries []func([]byte) []byte
	var table, entry uint16
	switch typ & 0x3ff {
	case nldevCmdResQPGet:
		table, entry = nlaResQP, nlaResQPEntry
		for _, q := range r.qps {
			entries = append(entries, func(b []byte) []byte {
				b = nlaU32(b, nlaPortIndex, 1)
				b = nlaU32(b, nlaResLQPN, q.qp.QPN())
				t := uint8(ibQPTDriver) // SRD is a driver QP type
				if q.typ == ibQPTUD {
					t = ibQPTUD
				}
				b = nlaU8(b, nlaResType, t)
				return nlaU32(b, nlaResPID, pid)
			})
		}
	case nldevCmdResCQGet:
		table, entry = nlaResCQ, nlaResCQEntry
		for i, c := range r.cqs {
			entries = append(entries, func(b []byte) []byte {
				b = nlaU32(b, nlaResCQE, uint32(c.cq.Depth()))
				b = nlaU64(b, nlaResUseCnt, 0)
				b = nlaU32(b, nlaResPID, pid)
				return nlaU32(b, nlaResCQN, uint32(i))
			})
		}
	case nldevCmdResMRGet:
		table, entry = nlaResMR, nlaResMREntry
		for _, m := range r.mrs {
			entries = append(entries, func(b []byte) []byte {
				b = nlaU32(b, nlaResRKey, m.mr.RKey())
				b = nlaU32(b, nlaResLKey, m.mr.LKey())
				b = nlaU64(b, nlaResMRLen, uint64(m.mr.Len()))
				b = nlaU32(b, nlaResPID, pid)
				return nlaU32(b, nlaResMRN, m.mr.LKey())
			})
		}
	case nldevCmdResPDGet:
		table, entry = nlaResPD, nlaResPDEntry
		for _, p := range r.pds {
			entries = append(entries, func(b []byte) []byte {
				b = nlaU64(b, nlaResUseCnt, 0)
				b = nlaU32(b, nlaResPID, pid)
				return nlaU32(b, nlaResPDN, uint32(p.pd.PDN()))
			})
		}
	}
	flags := uint16(0)
	if dump {
		flags = nlmFMulti
	}
	var out [][]byte
	for _, fill := range entries {
		b := d.nlDevHandle(nlHeader(typ, flags, seq, portID))
		b = nlaNest(b, table, func(b []byte) []byte { return nlaNest(b, entry, fill) })
		out = append(out, nlFinish(b))
		if !dump {
			break
		}
	}
	if dump {
		done := nlHeader(nlmsgDone, nlmFMulti, seq, portID)
		out = append(out, nlFinish(append(done, 0, 0, 0, 0)))
	} else if len(out) == 0 {
		out = append(out, nlFinish(d.nlDevHandle(nlHeader(typ, 0, seq, portID))))
	}
	return out
}

// hwCounters are the port's hardware counters under the names EFA's driver gives them
// (efa_port_stats_descs), in its order.
func (d *Device) hwCounters() []struct {
	name string
	v    uint64
} {
	c, w := d.e.Counters(), d.e.WRCounts()
	return []struct {
		name string
		v    uint64
	}{
		{"tx_bytes", c.TxBytes.Load()}, {"tx_pkts", c.TxPkts.Load()},
		{"rx_bytes", c.RxBytes.Load()}, {"rx_pkts", c.RxPkts.Load()},
		{"rx_drops", c.RxDrops.Load()},
		{"send_bytes", w.SendBytes}, {"send_wrs", w.SendWRs},
		{"recv_bytes", w.RecvBytes}, {"recv_wrs", w.RecvWRs},
		{"rdma_read_wrs", w.RDMAReadWRs}, {"rdma_read_bytes", w.RDMAReadBytes},
		{"rdma_read_wr_err", c.RDMAReadWRErr.Load()}, {"rdma_read_resp_bytes", c.RDMAReadRespBytes.Load()},
		{"rdma_write_wrs", w.RDMAWriteWRs}, {"rdma_write_bytes", w.RDMAWriteBytes},
		{"rdma_write_wr_err", c.RDMAWriteWRErr.Load()}, {"rdma_write_recv_bytes", c.RDMAWriteRecvBytes.Load()},
		{"retrans_bytes", c.RetransBytes.Load()}, {"retrans_pkts", c.RetransPkts.Load()},
		{"retrans_timeout_events", c.RetransTimeoutEvents.Load()},
		{"unresponsive_remote_events", c.UnresponsiveRemoteEvents.Load()},
		{"impaired_remote_conn_events", c.ImpairedRemoteConnEvents.Load()},
	}
}

// HWCounters returns every port counter EFA's driver has, by its name, in the driver's order.
func (d *Device) HWCounters() (names []string, values []uint64) {
	for _, c := range d.hwCounters() {
		names, values = append(names, c.name), append(values, c.v)
	}
	return names, values
}

// HWCounter is the value of the port counter EFA's driver names name (as hw_counters/name in
// sysfs shows it), and whether there is one of that name.
func (d *Device) HWCounter(name string) (uint64, bool) {
	for _, c := range d.hwCounters() {
		if c.name == name {
			return c.v, true
		}
	}
	return 0, false
}

// nlHWCounters is stat_get_doit's port counters (fill_stat_hwcounters).
func (d *Device) nlHWCounters(b []byte) []byte {
	b = d.nlDevHandle(b)
	b = nlaU32(b, nlaPortIndex, 1)
	return nlaNest(b, nlaStatHWCounters, func(b []byte) []byte {
		for _, c := range d.hwCounters() {
			b = nlaNest(b, nlaStatHWCounterEnt, func(b []byte) []byte {
				b = nlaStr(b, nlaStatHWCounterName, c.name)
				return nlaU64(b, nlaStatHWCounterVal, c.v)
			})
		}
		return b
	})
}
