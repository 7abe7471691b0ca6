package verbs

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/link"
)

// GID is a device's 16-byte address (union ibv_gid). See package config for how it encodes a
// UDP endpoint.
type GID [16]byte

func (g GID) String() string {
	b := hex.EncodeToString(g[:])
	return b[0:4] + ":" + b[4:8] + ":" + b[8:12] + ":" + b[12:16] + ":" + b[16:20] + ":" +
		b[20:24] + ":" + b[24:28] + ":" + b[28:32]
}

// Device is a software EFA device (struct ibv_device): an engine with its own address. Several
// contexts may be open on it at once; same-device traffic between them is carried out by the
// device itself.
type Device struct {
	name string
	guid uint64
	e    *engine.Device

	mu       sync.Mutex
	contexts int
	closed   bool
}

var registry struct {
	sync.Mutex
	devices []*Device
}

// NewDevice creates a device from cfg, starts its engine and adds it to the list GetDeviceList
// returns. Zero fields of cfg take config.Default's values. With cfg.Addr (an IP and a port, 0
// for any) the device binds UDP sockets there and talks SRD to other devices; with cfg.Link it
// uses that link. With neither, it gets a unique loopback GID (127.0.0.1 and a made-up port) and
// reaches only itself.
func NewDevice(cfg config.Device) (*Device, error) {
	switch {
	case cfg.Link != nil:
	case cfg.Addr.IsValid():
		l, err := link.ListenUDPOptions(cfg.Addr, cmp.Or(cfg.Paths, config.Default().Paths), link.UDPOptions{NoOffload: cfg.NoOffload})
		if err != nil {
			return nil, err
		}
		cfg.Link = l
	default:
		cfg.Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(nextPort.Add(1)))
	}
	e, err := engine.NewDevice(cfg)
	if err != nil {
		if cfg.Link != nil {
			cfg.Link.Close()
		}
		return nil, err
	}
	gid := e.GID()
	h := fnv.New64a()
	h.Write(gid[:])
	d := &Device{name: e.Config().Name, guid: h.Sum64(), e: e}
	registry.Lock()
	registry.devices = append(registry.devices, d)
	registry.Unlock()
	return d, nil
}

var nextPort atomic.Uint32

func init() { nextPort.Store(0xefa0) }

// Drive moves a driven device (config.Device.Driven) one step, on the caller's goroutine: it
// takes the datagrams its link holds, serves doorbells and the transport's timers against the
// device clock, and sends what that produced. It reports whether anything arrived or any work
// request was consumed. A device that is not driven has goroutines of its own and does nothing
// here. This is for simulation: one goroutine posting, polling and driving every device on a
// memlink.NewSim fabric makes a run that its seed replays exactly.
func (d *Device) Drive() bool { return d.e.Drive() }

// GetDeviceList returns the devices of this process (ibv_get_device_list).
func GetDeviceList() []*Device {
	registry.Lock()
	defer registry.Unlock()
	return append([]*Device(nil), registry.devices...)
}

// Name returns the device's name (ibv_get_device_name).
func (d *Device) Name() string { return d.name }

// PathMTU is the largest datagram (IP packet) the device sends: its SRD segments fit it.
func (d *Device) PathMTU() int { return d.e.Config().PathMTU }

// GUID returns the device's node GUID (ibv_get_device_guid).
func (d *Device) GUID() uint64 { return d.guid }

// GID returns the device's address.
func (d *Device) GID() GID { return GID(d.e.GID()) }

// Addr returns the UDP endpoint the device's GID stands for.
func (d *Device) Addr() netip.AddrPort {
	return engine.AddrFromGID(d.e.GID(), d.e.Config().Addr.Port())
}

// Close stops the device and removes it from the device list. It fails with EBUSY while contexts
// are open on it.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.contexts > 0 {
		n := d.contexts
		d.mu.Unlock()
		return fmt.Errorf("verbs: device %s has %d open contexts: %w", d.name, n, syscall.EBUSY)
	}
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	registry.Lock()
	for i, x := range registry.devices {
		if x == d {
			registry.devices = append(registry.devices[:i], registry.devices[i+1:]...)
			break
		}
	}
	registry.Unlock()
	return d.e.Close()
}

// Context is an open device (struct ibv_context). Its objects belong to it; Close refuses while
// any remain.
type Context struct {
	dev *Device
	e   *engine.Device
	cfg config.Device

	mu      sync.Mutex // guards objects and closed
	objects int
	closed  bool

	// qps maps a QP number to the context's live QP for polling: libefa's qp_table. A destroyed
	// QP leaves it at once; its CQs' graves mark the entries it left, which polling drops.
	qps []atomic.Pointer[QP]

	mrMu sync.RWMutex
	mrs  map[uint32]*MR // by lkey: the regions inline sends may read
}

// Open opens a context on d (ibv_open_device).
func (d *Device) Open() (*Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("verbs: device %s closed: %w", d.name, syscall.ENODEV)
	}
	d.contexts++
	cfg := d.e.Config()
	return &Context{dev: d, e: d.e, cfg: cfg, qps: make([]atomic.Pointer[QP], cfg.QPNTableSize), mrs: make(map[uint32]*MR)}, nil
}

// Device returns the context's device.
func (c *Context) Device() *Device { return c.dev }

// Close closes the context (ibv_close_device): EBUSY while objects created on it remain.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.objects > 0 {
		return fmt.Errorf("verbs: context still has %d objects: %w", c.objects, syscall.EBUSY)
	}
	c.closed = true
	c.dev.mu.Lock()
	c.dev.contexts--
	c.dev.mu.Unlock()
	return nil
}

// hold counts a new object of the context, failing once the context is closed.
func (c *Context) hold() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("verbs: context closed: %w", syscall.EINVAL)
	}
	c.objects++
	return nil
}

func (c *Context) release() {
	c.mu.Lock()
	c.objects--
	c.mu.Unlock()
}

// DeviceAttr are the attributes ibv_query_device reports.
type DeviceAttr struct {
	FWVer           string
	NodeGUID        uint64
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVer           uint32
	MaxQP           int
	MaxQPWR         int
	DeviceCapFlags  uint32
	MaxSGE          int // legacy: min(MaxSendSGE, MaxRecvSGE)
	MaxSGERD        int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxAH           int
	MaxPKeys        int
	PhysPortCnt     int

	// Extended attributes (ibv_query_device_ex).
	MaxSendSGE int
	MaxRecvSGE int
}

// AmazonVendorID is the PCI vendor id EFA devices report, which rdma-core's tests check.
const AmazonVendorID = 0x1d0f

// QueryDevice returns the device's attributes (ibv_query_device, ibv_query_device_ex).
func (c *Context) QueryDevice() DeviceAttr {
	cfg := &c.cfg
	return DeviceAttr{
		FWVer:        "0.0.0.0",
		NodeGUID:     c.dev.guid,
		SysImageGUID: c.dev.guid,
		MaxMRSize:    cfg.MaxMRSize,
		PageSizeCap:  4096,
		VendorID:     AmazonVendorID,
		VendorPartID: cfg.VendorPartID,
		HWVer:        cfg.HWVer,
		MaxQP:        cfg.MaxQP,
		MaxQPWR:      min(cfg.MaxSQWR, cfg.MaxRQWR, cfg.MaxLLQSize/64),
		MaxSGE:       min(cfg.MaxSQSGE, cfg.MaxRQSGE),
		MaxSGERD:     cfg.MaxSGERD,
		MaxCQ:        cfg.MaxCQ,
		MaxCQE:       cfg.MaxCQE,
		MaxMR:        cfg.MaxMR,
		MaxPD:        cfg.MaxPD,
		MaxAH:        cfg.MaxAH,
		MaxPKeys:     1,
		PhysPortCnt:  1,
		MaxSendSGE:   cfg.MaxSQSGE,
		MaxRecvSGE:   cfg.MaxRQSGE,
	}
}

// PortAttr are the attributes ibv_query_port reports.
type PortAttr struct {
	State         PortState
	MaxMTU        MTU
	ActiveMTU     MTU
	GIDTblLen     int
	PortCapFlags  uint32
	MaxMsgSz      uint32
	PKeyTblLen    int
	LID           uint16
	SMLID         uint16
	LMC           uint8
	MaxVLNum      uint8
	ActiveWidth   uint8
	ActiveSpeed   uint8
	PhysState     uint8
	LinkLayer     uint8
	LinkSpeedGbps int
}

// QueryPort returns port 1's attributes (ibv_query_port) with the EFA kernel driver's values:
// ACTIVE, link up, one GID, one pkey, max_msg_sz the device MTU. Other ports are EINVAL.
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	if port != 1 {
		return PortAttr{}, fmt.Errorf("verbs: port %d; the device has port 1 only: %w", port, syscall.EINVAL)
	}
	width, speed := uint8(2), uint8(32) // 4X EDR: 100 Gb/s
	if c.cfg.LinkSpeedGbps >= 400 {
		width, speed = 16, 64 // 8X HDR
	}
	return PortAttr{
		State: PortActive, MaxMTU: mtuEnum(c.cfg.MTU), ActiveMTU: mtuEnum(c.cfg.MTU),
		GIDTblLen: 1, MaxMsgSz: uint32(c.cfg.MTU), PKeyTblLen: 1, LMC: 1, MaxVLNum: 1,
		ActiveWidth: width, ActiveSpeed: speed, PhysState: uapi.PhysStateLinkUp, LinkSpeedGbps: c.cfg.LinkSpeedGbps,
	}, nil
}

// QueryGID returns the GID at index of port (ibv_query_gid): the device address at index 0.
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	if port != 1 || index != 0 {
		return GID{}, fmt.Errorf("verbs: GID %d of port %d; the device has GID 0 of port 1: %w", index, port, syscall.EINVAL)
	}
	return c.dev.GID(), nil
}

// QueryPKey returns the pkey at index of port (ibv_query_pkey): 0xffff at index 0.
func (c *Context) QueryPKey(port uint8, index int) (uint16, error) {
	if port != 1 || index != 0 {
		return 0, fmt.Errorf("verbs: pkey %d of port %d; the device has pkey 0 of port 1: %w", index, port, syscall.EINVAL)
	}
	return 0xffff, nil
}

// AsyncEvent is an asynchronous event (struct ibv_async_event). QP or CQ is set for affiliated
// events.
type AsyncEvent struct {
	Type EventType
	QP   *QP
	CQ   *CQ
}

// GetAsyncEvent waits for the device's next asynchronous event (ibv_get_async_event), or for ctx
// to end. Events name objects of any context on the device; QP and CQ are set when the object
// belongs to this context.
func (c *Context) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	ev, err := c.e.GetAsyncEvent(ctx)
	if err != nil {
		return AsyncEvent{}, err
	}
	out := AsyncEvent{Type: EventType(ev.Type)}
	if q, ok := ev.QP.Owner().(*QP); ok && q.ctx == c {
		out.QP = q
	}
	if cq, ok := ev.CQ.Owner().(*CQ); ok && cq.ctx == c {
		out.CQ = cq
	}
	return out, nil
}

// Counters are the device's port counters with EFA's hw_counters names (efa_verbs.c), as a
// snapshot.
type Counters struct {
	TxBytes, TxPkts, RxBytes, RxPkts, RxDrops                        uint64
	SendBytes, SendWRs, RecvBytes, RecvWRs                           uint64
	RDMAReadWRs, RDMAReadBytes, RDMAReadWRErr, RDMAReadRespBytes     uint64
	RDMAWriteWRs, RDMAWriteBytes, RDMAWriteWRErr, RDMAWriteRecvBytes uint64
	RetransBytes, RetransPkts, RetransTimeoutEvents                  uint64
	UnresponsiveRemoteEvents, ImpairedRemoteConnEvents               uint64
	CQOverruns, BadPackets, StalePackets                             uint64
	Unvalidated, AuthFailures, Replays                               uint64
	SpuriousRetrans                                                  uint64 // packets counted lost that arrived after all
	SpuriousTimeouts                                                 uint64 // retransmission timeouts that proved spurious
	SparseCopies                                                     uint64 // second copies of packets sent while few were in flight
	EngineWakeups                                                    uint64 // times the device's engine loop woke (none while idle)
	PeersForgotten                                                   uint64 // peer contexts dropped idle, by age or to make room
}

// Counters returns a snapshot of the device's counters.
func (c *Context) Counters() Counters {
	e, w := c.e.Counters(), c.e.WRCounts()
	return Counters{
		TxBytes: e.TxBytes.Load(), TxPkts: e.TxPkts.Load(), RxBytes: e.RxBytes.Load(), RxPkts: e.RxPkts.Load(),
		RxDrops: e.RxDrops.Load(), SendBytes: w.SendBytes, SendWRs: w.SendWRs,
		RecvBytes: w.RecvBytes, RecvWRs: w.RecvWRs, RDMAReadWRs: w.RDMAReadWRs,
		RDMAReadBytes: w.RDMAReadBytes, RDMAReadWRErr: e.RDMAReadWRErr.Load(),
		RDMAReadRespBytes: e.RDMAReadRespBytes.Load(), RDMAWriteWRs: w.RDMAWriteWRs,
		RDMAWriteBytes: w.RDMAWriteBytes, RDMAWriteWRErr: e.RDMAWriteWRErr.Load(),
		RDMAWriteRecvBytes: e.RDMAWriteRecvBytes.Load(), CQOverruns: e.CQOverruns.Load(),
		RetransBytes: e.RetransBytes.Load(), RetransPkts: e.RetransPkts.Load(),
		RetransTimeoutEvents: e.RetransTimeoutEvents.Load(), UnresponsiveRemoteEvents: e.UnresponsiveRemoteEvents.Load(),
		ImpairedRemoteConnEvents: e.ImpairedRemoteConnEvents.Load(), BadPackets: e.BadPackets.Load(),
		StalePackets: e.StalePackets.Load(), Unvalidated: e.Unvalidated.Load(), AuthFailures: e.AuthFailures.Load(),
		Replays: e.Replays.Load(), SpuriousRetrans: e.SpuriousRetrans.Load(),
		SpuriousTimeouts: e.SpuriousTimeouts.Load(),
		SparseCopies:     e.SparseCopies.Load(), EngineWakeups: e.EngineWakeups.Load(),
		PeersForgotten: e.PeersForgotten.Load(),
	}
}

// PathStat is one path's scoreboard towards one peer device: smoothed RTT, packets sent and
// counted lost (Lost stops at 2^32-1), whether it is marked failed, and the peer stream's
// congestion window.
type PathStat struct {
	Peer   GID
	Path   int
	SRTT   time.Duration
	Sent   uint64
	Lost   uint64
	Failed bool
	Cwnd   float64
}

// PathStats returns the device's per-peer, per-path figures.
func (c *Context) PathStats() []PathStat {
	var out []PathStat
	for _, p := range c.e.PathStats() {
		out = append(out, PathStat{Peer: GID(p.Peer), Path: p.Path, SRTT: p.SRTT, Sent: p.Sent, Lost: p.Lost,
			Failed: p.Failed, Cwnd: p.Cwnd})
	}
	return out
}
