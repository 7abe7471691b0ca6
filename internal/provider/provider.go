// Package provider is the door between package verbs, the provider, and package efadv: the EFA
// values and operations that libefa keeps inside its own structures and rdma-core's efadv.h
// reports (the device attributes a context caches when it opens, a QP's driver attributes, the raw
// rings, the extra completion fields). Being internal, none of it is part of the public API: a
// program reaches these only through efadv's functions.
//
// Package verbs imports this package, so this package cannot name verbs' types. Each hook is
// therefore an any holding a function of verbs' types; its comment gives the exact type. Package
// verbs sets every hook in its init; package efadv asserts each to its type once, when it
// initialises, which is after verbs (efadv imports verbs): a hook of the wrong type stops any
// program that imports efadv at start-up, and every efadv test with it.
package provider

// QPAttr is the EFA part of a QP's creation (what efadv_qp_init_attr carries to libefa's
// create_qp).
type QPAttr struct {
	DriverQPType uint32 // uapi.DriverQPTypeSRD
	Flags        uint16 // uapi.DVQPFlag*
	SL           uint8
	WRFlags      uint64 // uapi.DVWRExWithProcessingHints
}

// WQ describes one work queue's ring as the device reads it (efadv_wq_attr).
type WQ struct {
	Buffer     []byte
	EntrySize  int
	NumEntries int
	Doorbell   *uint32
	MaxBatch   int
	ReqID64    bool // the SQ carries 64-bit request ids
}

// Hooks, set by package verbs. The functions do what the efadv function named after the arrow
// needs from the provider.
var (
	// ContextConfig is func(*verbs.Context) *config.Device: the device's configuration, with
	// its defaults filled in, as the context cached it when it opened (libefa caches the
	// device's attributes in its context likewise). The caller must not change it. For
	// efadv_query_device and the depth queries.
	ContextConfig any

	// CreateCQ is func(*verbs.Context, *verbs.CQInitAttrEx, sgid, unsolicited bool)
	// (*verbs.CQ, error): efadv_create_cq.
	CreateCQ any

	// ReadSGID is func(*verbs.CQ) (verbs.GID, error): efadv_wc_read_sgid.
	ReadSGID any

	// IsUnsolicited is func(*verbs.CQ) bool: efadv_wc_is_unsolicited.
	IsUnsolicited any

	// CQRing is func(*verbs.CQ) (buf []byte, entrySize, entries int, doorbell *uint32):
	// efadv_query_cq.
	CQRing any

	// CreateQPEx is func(*verbs.Context, *verbs.QPInitAttrEx, *QPAttr) (*verbs.QP, error):
	// efadv_create_qp_ex.
	CreateQPEx any

	// CreateQP is func(*verbs.PD, *verbs.QPInitAttr, *QPAttr) (*verbs.QP, error):
	// efadv_create_driver_qp.
	CreateQP any

	// QPWQs is func(*verbs.QP) (sq, rq WQ): efadv_query_qp_wqs. From then on the device polls
	// the QP's doorbells, since the program may store them itself.
	QPWQs any

	// RingDoorbell is func(*verbs.QP, *uint32, uint32) error: efadv.RingDoorbell.
	RingDoorbell any

	// SetProcessingHints is func(*verbs.QPEx, uint32): efadv_wr_set_processing_hints.
	SetProcessingHints any

	// AHN is func(*verbs.AH) uint16: efadv_query_ah.
	AHN any
)
