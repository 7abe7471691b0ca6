package uverbs

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/softefa/softefa/config"
)

// A Quota bounds the objects that the Files of one program hold together, so that one program
// cannot take all of a device that others share (the host device: docs/security.md, "The host
// device"). The kernel's uverbs has no such bound; a device per process needs none.
//
// Commands check it before they create an object (ENOMEM past it, as past the device's own
// maximum) and the File counts what it holds; a program's commands are carried out one at a time
// (the host device serves each program's requests in order), so the check and the count agree.
type Quota struct {
	max [nKinds]int
	mu  sync.Mutex
	n   [nKinds]int // what the program holds
}

type kind int

const (
	kindPD kind = iota
	kindMR
	kindCQ
	kindQP
	kindAH
	nKinds
)

var kindNames = [nKinds]string{"PDs", "MRs", "CQs", "QPs", "AHs"}

// NewQuota allows a program share (0 < share ≤ 1) of each of cfg's maxima (PDs, MRs, CQs, QPs,
// AHs), at least one of each; cfg is filled (engine.Device.Config).
func NewQuota(cfg config.Device, share float64) *Quota {
	q := &Quota{}
	for k, m := range [nKinds]int{cfg.MaxPD, cfg.MaxMR, cfg.MaxCQ, cfg.MaxQP, cfg.MaxAH} {
		q.max[k] = max(1, int(share*float64(m)))
	}
	return q
}

// SetQuota makes f's objects count against q, which other Files of the same program share. Set
// before the first command.
func (f *File) SetQuota(q *Quota) {
	f.mu.Lock()
	f.quota = q
	f.mu.Unlock()
}

// admit reports ENOMEM when the program holds as many objects of kind k as its quota allows.
func (f *File) admit(k kind) error {
	q := f.quota
	if q == nil {
		return nil
	}
	q.mu.Lock()
	n := q.n[k]
	q.mu.Unlock()
	if n >= q.max[k] {
		return fmt.Errorf("uverbs: the program holds %d %s, its share of the device: %w", n, kindNames[k], syscall.ENOMEM)
	}
	return nil
}

// count adds d to the program's count of o's kind.
func (f *File) count(o any, d int) {
	if f.quota == nil {
		return
	}
	var k kind
	switch o.(type) {
	case *pdObj:
		k = kindPD
	case *mrObj:
		k = kindMR
	case *cqObj:
		k = kindCQ
	case *qpObj:
		k = kindQP
	case *ahObj:
		k = kindAH
	default:
		return
	}
	f.quota.mu.Lock()
	f.quota.n[k] += d
	f.quota.mu.Unlock()
}
