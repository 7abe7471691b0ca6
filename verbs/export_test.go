package verbs

// QPGen returns the generation of qp's number: the high bits of its 16-bit request ids.
func QPGen(qp *QP) uint16 { return qp.e.Gen() }

// AHN returns the device's number for ah (efadv_query_ah), the value completions report as SLID.
func AHN(ah *AH) uint16 { return ah.e.AHN() }

// ScratchBytes is what ctx's device's busy-poll scratch holds (engine.Device.ScratchBytes).
func ScratchBytes(ctx *Context) int64 { return ctx.e.ScratchBytes() }

// BusyPolled reports whether ctx's device counts an application goroutine as busy-polling it
// (engine.Device.BusyPolled).
func BusyPolled(ctx *Context) bool { return ctx.e.BusyPolled() }

// CQWritten is how many entries cq's device has written to it (engine.CQ.Written), read
// without polling.
func CQWritten(cq *CQ) uint32 { return cq.e.Written() }

// RxOnSocket reports whether ctx's device's receive loop waits on its socket
// (engine.Device.RxOnSocket).
func RxOnSocket(ctx *Context) bool { return ctx.e.RxOnSocket() }
