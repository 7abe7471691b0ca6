// Package config describes a software EFA device: its name, the UDP endpoint its address stands
// for, and every limit it reports through the verbs and efadv queries. The defaults follow EFA
// where EFA's values are known (8 KiB MTU, 2 send SGEs, 1 RDMA SGE, 32/80-byte inline) and are
// generous elsewhere.
package config

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/link"
)

// Device describes a device: its name, address and limits. Zero fields take the defaults of
// Default. Where EFA allows a limit of zero (no inline data, no caps, no TX batch limit, no minimum
// SQ size, RNR retries at once), the field's comment says so and None (or CapsNone) asks for it.
type Device struct {
	Name string
	// Addr is the UDP endpoint the device stands for; its GID is derived from it (GIDFromAddr).
	Addr netip.AddrPort

	MTU         int    // largest SEND payload (port max_msg_sz); default 8192
	MaxRDMASize uint32 // largest RDMA read or write; default 1 GiB

	MaxQP            int    // live QPs; default 4096
	QPNTableSize     int    // QPNs are below this (≤ 65536); default 65536
	QPNReservedStart uint32 // first QPN reserved for non-verbs use
	QPNReservedEnd   uint32 // last reserved QPN; End < Start means none (the default)

	MaxCQ     int    // default 4096
	MaxCQE    int    // entries per CQ (≤ 32768); default 32768
	MaxPD     int    // default 65535
	MaxMR     int    // default 65535 (lkeys carry a 16-bit index)
	MaxMRSize uint64 // default 1 TiB
	MaxAH     int    // per device; default 65535

	// CompVectors is num_comp_vectors, the completion vectors a CQ may name (its events'
	// interrupt, on hardware). Default one per CPU: EFA's driver makes an event queue per online
	// CPU, up to the device's limit.
	CompVectors int

	MaxLLQSize      int // SQ ring bytes (≤ 2 MiB: 32768 WQEs); default 256 KiB
	MaxSQWR         int // default 4096
	MaxRQWR         int // RX descriptors per RQ (≤ 32768); default 8192
	MaxSQSGE        int // default 2 (EFA_IO_TX_DESC_NUM_BUFS)
	MaxRQSGE        int // default 2, at most MaxRQSGELimit
	MaxSGERD        int // local SGEs in an RDMA op; default 1
	InlineBufSize   int // default 32; None: no inline data in a 64-byte WQE
	InlineBufSizeEx int // default 80; None: no inline data at all
	MaxTxBatch      int // in 64-byte units; default 16; None: no limit (libefa rings once per post)
	MinSQWR         int // default 16; None: no minimum SQ size

	// Caps are EFADV_DEVICE_ATTR_CAPS_* bits; default RDMA_READ|RNR_RETRY|CQ_WITH_SGID|RDMA_WRITE|
	// UNSOLICITED_WRITE_RECV. CapsNone: none of them, as on the first EFA devices.
	Caps uint32
	// RequestID64 makes send queues take 64-bit request ids (EFADV_WQ_CAPS_64_BIT_REQ_ID).
	RequestID64 bool

	VendorPartID  uint32 // default 0xefa2; never 0xefa0, which makes libfabric assume sub-CQs
	HWVer         uint32
	LinkSpeedGbps int // default 100

	// Link carries the device's traffic to other devices. Nil: package verbs opens a UDP link on
	// Addr when Addr is set; without either the device reaches only itself.
	Link link.Link
	// Paths is the number of paths (UDP source ports) per device; default 4.
	Paths int
	// PathMTU is the largest IP packet on the network; SRD messages are cut into segments that
	// fit it. Default 1500 (Ethernet), or 9001 when Addr is a loopback address: no network
	// between, so the jumbo frame of the clouds EFA runs in (EFA's own 8 KiB MTU), which carries
	// an 8 KiB message in one datagram instead of six.
	PathMTU int
	// TransportTimeout is how long a peer may go without acknowledging our packets or sending
	// new ones of its own, while we wait on it, before every outstanding WR to it fails
	// (unresponsive or unreachable). A peer still streaming read data or answers behind a long
	// transfer is making progress. Default 5 s.
	TransportTimeout time.Duration
	// MaxPeers bounds the peer contexts a device keeps; default 65536. When they are all in use,
	// a new validated peer takes the place of those idle longest (MaxPeers/64 of them go at once,
	// at most half the idle ones, at least one); peers with anything
	// outstanding are never given up for a newcomer.
	MaxPeers int
	// PeerIdleTimeout is how long a peer context with nothing outstanding is kept after its last
	// traffic; then it is forgotten, keeping only the few bytes that let the two devices resume
	// their streams where they were (docs/wire.md, "Forgotten peers"). Default 2 minutes;
	// negative: kept until MaxPeers needs the room.
	PeerIdleTimeout time.Duration
	// Key, when set, turns on authenticated encryption of every datagram (AES-256-GCM): 32
	// bytes, the same on every device that is to talk. Read it with KeyFromFile or KeyFromEnv;
	// never take it from a command-line flag, which other users of the machine can read.
	Key []byte
	// RxSpin is how long the receive loop keeps reading without waiting after traffic, so that
	// it does not depend on the Go network poller's wake-up (which a busy-polling application
	// can delay by milliseconds). It stops sooner when a yield between reads takes over 40 µs:
	// other goroutines are waiting for the processor; and it does not spin while an application
	// goroutine busy-polls the device (CQ.Poll on an empty CQ reads the socket itself), so that one
	// device has one spinning thread, not two; nor with GOMAXPROCS 1, where a spinning goroutine
	// keeps the network poller, and every goroutine waiting on it, from running. Default 200 µs;
	// negative: never spin.
	RxSpin time.Duration

	// PollMin and PollMax bound the period at which the engine looks at doorbells stored without
	// Ring: PollMin after activity, doubling to PollMax when idle. Defaults 1 ms and 16 ms. They
	// have no "none": that polling is how the device notices a doorbell a program stores itself
	// (efadv.QueryQPWQs); negative is EINVAL.
	PollMin, PollMax time.Duration
	// RNRInterval is the delay between RNR retries; default 1 ms; negative: none, a WR that met
	// RNR is sent again at the engine's next step.
	RNRInterval time.Duration
	// NoSparseCopies turns off the second copy, on another path, of each packet sent while at
	// most 4 are in flight to its peer and the peer's stream has lost a packet within the last
	// second. The copies make a single loss cost nothing in a latency-bound exchange (ping-pong
	// p99 under 1% loss: 2.6 ms without them, 1 ms with) at the price of twice the datagrams
	// while traffic is that sparse; bulk traffic never has so few in flight, and a network that
	// loses nothing pays nothing.
	NoSparseCopies bool
	// NoOffload keeps UDP GSO and GRO off on the UDP link package verbs opens on Addr (the
	// link's UDPOptions): every datagram a packet of its own, as a capture needs.
	NoOffload bool

	// Driven makes a device with no goroutines of its own: whoever owns it moves it by calling
	// Drive (verbs.Context.Drive), which reads what the link holds, serves doorbells and timers,
	// and sends. The link must be a link.Poller. With Clock, Rand and a simulated network
	// (memlink.NewSim) one goroutine then runs everything, so a seed replays a run exactly.
	Driven bool
	// Clock, if set, is the device's time: monotonic, from any origin. Default: the wall clock.
	Clock func() time.Duration
	// Rand, if set, supplies every random bit the device draws (incarnation, rkeys, cookie key,
	// sealing salt) in place of crypto/rand. For simulation only: predictable keys protect
	// nothing.
	Rand io.Reader

	filled bool // Fill has run: zero fields are zero, not defaults
}

// None, in an int field whose comment offers it, asks for zero where zero would mean the default.
// Fill turns it into 0.
const None = -1

// CapsNone, as Device.Caps, is a device with none of EFA's caps (where zero means the default
// caps). It is a bit no EFA cap uses; Fill keeps it, so a filled Device's Caps still says so, and
// every cap test on it finds no cap.
const CapsNone uint32 = 1 << 31

// LoopbackPathMTU is the default PathMTU of a device on a loopback address.
const LoopbackPathMTU = 9001

// MaxRQSGELimit bounds MaxRQSGE so that a receive WR's buffers fit a fixed array.
const MaxRQSGELimit = 16

// Default returns the default limits.
func Default() Device {
	return Device{
		Name: "efa_0", MTU: 8192, MaxRDMASize: 1 << 30,
		MaxQP: 4096, QPNTableSize: 1 << 16, QPNReservedStart: 1, QPNReservedEnd: 0,
		MaxCQ: 4096, MaxCQE: 32768, CompVectors: runtime.NumCPU(),
		MaxPD: 65535, MaxMR: 65535, MaxMRSize: 1 << 40, MaxAH: 65535,
		MaxLLQSize: 256 << 10, MaxSQWR: 4096, MaxRQWR: 8192, MaxSQSGE: 2, MaxRQSGE: 2, MaxSGERD: 1,
		InlineBufSize: 32, InlineBufSizeEx: 80, MaxTxBatch: 16, MinSQWR: 16,
		Caps: uapi.CapRDMARead | uapi.CapRNRRetry | uapi.CapCQWithSGID | uapi.CapRDMAWrite |
			uapi.CapUnsolicitedWriteRecv,
		VendorPartID: 0xefa2, LinkSpeedGbps: 100,
		Paths: 4, PathMTU: 1500, TransportTimeout: 5 * time.Second, MaxPeers: 1 << 16, PeerIdleTimeout: 2 * time.Minute, RxSpin: 200 * time.Microsecond,
		PollMin: time.Millisecond, PollMax: 16 * time.Millisecond, RNRInterval: time.Millisecond,
	}
}

// Fill gives every zero field its default, turns None into 0, and checks the result: EINVAL for
// limits the descriptor formats cannot carry and for negative values where None is not offered. A
// Device Fill has filled keeps its zeros as zeros when filled again.
func (c *Device) Fill() error {
	if c.filled {
		return c.check()
	}
	def := Default()
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	if c.Name == "" {
		c.Name = def.Name
	}
	setInt(&c.MTU, def.MTU)
	setInt(&c.MaxQP, def.MaxQP)
	setInt(&c.QPNTableSize, def.QPNTableSize)
	setInt(&c.MaxCQ, def.MaxCQ)
	setInt(&c.MaxCQE, def.MaxCQE)
	setInt(&c.CompVectors, def.CompVectors)
	setInt(&c.MaxPD, def.MaxPD)
	setInt(&c.MaxMR, def.MaxMR)
	setInt(&c.MaxAH, def.MaxAH)
	setInt(&c.MaxLLQSize, def.MaxLLQSize)
	setInt(&c.MaxSQWR, def.MaxSQWR)
	setInt(&c.MaxRQWR, def.MaxRQWR)
	setInt(&c.MaxSQSGE, def.MaxSQSGE)
	setInt(&c.MaxRQSGE, def.MaxRQSGE)
	setInt(&c.MaxSGERD, def.MaxSGERD)
	setInt(&c.InlineBufSize, def.InlineBufSize)
	setInt(&c.InlineBufSizeEx, def.InlineBufSizeEx)
	setInt(&c.MaxTxBatch, def.MaxTxBatch)
	setInt(&c.MinSQWR, def.MinSQWR)
	setInt(&c.LinkSpeedGbps, def.LinkSpeedGbps)
	setInt(&c.Paths, def.Paths)
	if c.PathMTU == 0 && c.Addr.Addr().IsLoopback() {
		c.PathMTU = LoopbackPathMTU
	}
	setInt(&c.PathMTU, def.PathMTU)
	setInt(&c.MaxPeers, def.MaxPeers)
	if c.TransportTimeout == 0 {
		c.TransportTimeout = def.TransportTimeout
	}
	if c.PeerIdleTimeout == 0 {
		c.PeerIdleTimeout = def.PeerIdleTimeout
	}
	if c.RxSpin == 0 {
		c.RxSpin = def.RxSpin
	}
	if c.MaxRDMASize == 0 {
		c.MaxRDMASize = def.MaxRDMASize
	}
	if c.MaxMRSize == 0 {
		c.MaxMRSize = def.MaxMRSize
	}
	if c.QPNReservedStart == 0 && c.QPNReservedEnd == 0 {
		c.QPNReservedStart, c.QPNReservedEnd = def.QPNReservedStart, def.QPNReservedEnd
	}
	if c.Caps == 0 {
		c.Caps = def.Caps
	}
	if c.VendorPartID == 0 {
		c.VendorPartID = def.VendorPartID
	}
	if c.PollMin == 0 {
		c.PollMin = def.PollMin
	}
	if c.PollMax == 0 {
		c.PollMax = def.PollMax
	}
	if c.RNRInterval == 0 {
		c.RNRInterval = def.RNRInterval
	}
	for _, p := range []*int{&c.InlineBufSize, &c.InlineBufSizeEx, &c.MaxTxBatch, &c.MinSQWR} {
		if *p == None {
			*p = 0
		}
	}
	c.RNRInterval = max(c.RNRInterval, 0)
	c.filled = true
	return c.check()
}

// check validates a filled Device.
func (c *Device) check() error {
	if _, ok := c.Link.(link.Poller); c.Driven && c.Link != nil && !ok {
		return fmt.Errorf("config: a driven device needs a link it can read without waiting (link.Poller): %w", syscall.EINVAL)
	}
	switch {
	case c.MTU < 64 || c.MTU > 1<<16:
		return fmt.Errorf("config: MTU %d outside [64, 65536]: %w", c.MTU, syscall.EINVAL)
	case c.MaxCQE > 1<<15:
		return fmt.Errorf("config: MaxCQE %d over 32768 (CQ doorbells count 16 bits): %w", c.MaxCQE, syscall.EINVAL)
	case c.MaxRQWR > 1<<15 || c.MaxLLQSize > 64<<15:
		return fmt.Errorf("config: MaxRQWR %d or MaxLLQSize %d over 32768 entries (ring counters count 16 bits): %w",
			c.MaxRQWR, c.MaxLLQSize, syscall.EINVAL)
	case c.CompVectors < 1:
		return fmt.Errorf("config: %d completion vectors: %w", c.CompVectors, syscall.EINVAL)
	case c.MaxRQSGE > MaxRQSGELimit:
		return fmt.Errorf("config: MaxRQSGE %d over %d: %w", c.MaxRQSGE, MaxRQSGELimit, syscall.EINVAL)
	case c.MaxSQSGE > 2 || c.MaxSGERD > 1:
		return fmt.Errorf("config: a TX WQE holds at most 2 SGEs, 1 for RDMA: %w", syscall.EINVAL)
	case c.InlineBufSizeEx > 80 || c.InlineBufSize > c.InlineBufSizeEx:
		return fmt.Errorf("config: inline sizes %d/%d over the 128-byte WQE's 80: %w",
			c.InlineBufSize, c.InlineBufSizeEx, syscall.EINVAL)
	case c.MaxMR > 65535 || c.MaxPD > 65535 || c.MaxAH > 65535:
		return fmt.Errorf("config: MR, PD and AH counts are 16-bit: %w", syscall.EINVAL)
	case c.VendorPartID == 0xefa0:
		return fmt.Errorf("config: vendor part id 0xefa0 means sub-CQs, which this device lacks: %w", syscall.EINVAL)
	case c.PathMTU < 576 || c.PathMTU > 65535:
		return fmt.Errorf("config: path MTU %d outside [576, 65535]: %w", c.PathMTU, syscall.EINVAL)
	case c.Paths < 1 || c.Paths > 255:
		return fmt.Errorf("config: %d paths outside [1, 255]: %w", c.Paths, syscall.EINVAL)
	case c.InlineBufSize < 0 || c.InlineBufSizeEx < 0 || c.MaxTxBatch < 0 || c.MinSQWR < 0:
		return fmt.Errorf("config: negative limit other than None: %w", syscall.EINVAL)
	case c.PollMin < 0 || c.PollMax < 0:
		return fmt.Errorf("config: negative doorbell poll period %v/%v: %w", c.PollMin, c.PollMax, syscall.EINVAL)
	case c.Caps&CapsNone != 0 && c.Caps != CapsNone:
		return fmt.Errorf("config: caps %#x: CapsNone with caps: %w", c.Caps, syscall.EINVAL)
	case c.MaxSQWR > c.MaxLLQSize/64:
		c.MaxSQWR = c.MaxLLQSize / 64
	}
	return nil
}

// GIDFromAddr maps a UDP endpoint to a 16-byte GID. An IPv4 endpoint a.b.c.d:p becomes the
// IPv4-mapped IPv6 address ::ffff:a.b.c.d with the port, big-endian, in bytes 8 and 9; an IPv6
// endpoint is its address (the port is the device's configured one). The zero AddrPort gives the
// zero GID.
func GIDFromAddr(ap netip.AddrPort) [16]byte {
	a := ap.Addr()
	if !a.IsValid() {
		return [16]byte{}
	}
	if a.Is4() || a.Is4In6() {
		var g [16]byte
		v4 := a.Unmap().As4()
		copy(g[12:], v4[:])
		g[10], g[11] = 0xff, 0xff
		g[8], g[9] = byte(ap.Port()>>8), byte(ap.Port())
		return g
	}
	return a.As16()
}

// AddrFromGID is the inverse of GIDFromAddr; port is used for IPv6 GIDs.
func AddrFromGID(g [16]byte, port uint16) netip.AddrPort {
	if g[10] == 0xff && g[11] == 0xff && [8]byte(g[0:8]) == [8]byte{} {
		p := uint16(g[8])<<8 | uint16(g[9])
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(g[12:16])), p)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(g), port)
}

// KeyFromFile reads a 32-byte key from a file holding either the 32 bytes or 64 hex digits
// (surrounding white space ignored). It refuses a file others may read or write.
func KeyFromFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("config: key file %s is readable or writable by others (mode %v): %w", path, st.Mode().Perm(), syscall.EPERM)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseKey(b)
}

// KeyEnv is the environment variable that holds a device's key for softefa's commands and the
// programs softefa run starts (a key is never a flag's value, which other users can read).
const KeyEnv = "SOFTEFA_KEY"

// KeyFromEnvIfSet is KeyFromEnv(KeyEnv) when the variable is set, and no key (nil) when it is
// not; an error names the variable.
func KeyFromEnvIfSet() ([]byte, error) {
	if _, ok := os.LookupEnv(KeyEnv); !ok {
		return nil, nil
	}
	k, err := KeyFromEnv(KeyEnv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyEnv, err)
	}
	return k, nil
}

// KeyFromEnv reads a key of 64 hex digits from the environment variable name.
func KeyFromEnv(name string) ([]byte, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return nil, fmt.Errorf("config: %s is not set: %w", name, syscall.ENOENT)
	}
	return parseKey([]byte(v))
}

func parseKey(b []byte) ([]byte, error) {
	if len(b) == 32 {
		return b, nil
	}
	s := strings.TrimSpace(string(b))
	k, err := hex.DecodeString(s)
	if err != nil || len(k) != 32 {
		return nil, fmt.Errorf("config: a key is 32 bytes or 64 hex digits: %w", syscall.EINVAL)
	}
	return k, nil
}
