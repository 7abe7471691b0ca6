package config

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// Zero takes the default; None and CapsNone ask for zero where EFA allows it, and a filled Device
// keeps them when filled again.
func TestFillNone(t *testing.T) {
	var c Device
	if err := c.Fill(); err != nil {
		t.Fatal(err)
	}
	def := Default()
	if c.InlineBufSize != def.InlineBufSize || c.MinSQWR != def.MinSQWR || c.Caps != def.Caps || c.RNRInterval != def.RNRInterval {
		t.Fatalf("zero fields not defaulted: %+v", c)
	}

	c = Device{InlineBufSize: None, InlineBufSizeEx: None, MaxTxBatch: None, MinSQWR: None, Caps: CapsNone,
		RNRInterval: -1}
	for range 2 {
		if err := c.Fill(); err != nil {
			t.Fatal(err)
		}
		if c.InlineBufSize != 0 || c.InlineBufSizeEx != 0 || c.MaxTxBatch != 0 || c.MinSQWR != 0 ||
			c.Caps != CapsNone || c.RNRInterval != 0 {
			t.Fatalf("None fields: %+v", c)
		}
	}
	if c.MTU != def.MTU {
		t.Fatalf("MTU %d after filling twice, want %d", c.MTU, def.MTU)
	}
}

// Negative values are EINVAL where None is not offered, CapsNone does not mix with caps, and rings
// stop at 32768 entries.
func TestFillRefusesOutOfRange(t *testing.T) {
	for _, c := range []Device{
		{InlineBufSize: -2},
		{MinSQWR: -7},
		{PollMin: -time.Millisecond},
		{PollMax: -1},
		{Caps: CapsNone | 1},
		{MaxRQWR: 1 << 16}, // ring counters are 16 bits: a ring of 65536 could not tell full from empty
		{MaxLLQSize: 128 << 16},
	} {
		if err := c.Fill(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Fill(%+v) = %v, want EINVAL", c, err)
		}
	}
}
