// Package verbs is the verbs API (libibverbs' ibv_* calls) of softefa, a software EFA device, with
// libefa's semantics: the provider that turns posts into EFA work-queue entries and polls EFA
// completion entries. Package efadv adds EFA's direct verbs on top, and is the only way to EFA's
// extras (SRD QPs, the AH number, the source-GID and unsolicited completion fields, the raw rings),
// as efadv.h is in C; the two packages share the provider's internals through internal/provider.
//
// # Objects
//
// A Device (NewDevice, GetDeviceList) is one software EFA device with its own address (GID) and
// its own engine goroutine. Open gives a Context; a device may have several open at once, and
// QPs of different contexts on one device exchange traffic through the device itself
// (same-device loopback), as rdma-core's EFA tests require. PDs, MRs, CQs, completion channels,
// AHs and QPs are created from a context and must be destroyed before it closes (EBUSY
// otherwise), as in libibverbs.
//
// Each Go function's doc names the C function it mirrors. Where C passes a struct with a
// comp_mask, so does Go; where C returns an int errno, Go returns an error that matches the errno
// EFA gives with errors.Is (for example errors.Is(err, syscall.EINVAL)), wrapped with a message
// saying what was wrong. Immediate data is a host-order uint32 both when posting and in
// completions (C passes it big-endian).
//
// # The rings are the contract
//
// PostSend and the QPEx iterator write 64- or 128-byte TX WQEs (package efaio) into the QP's
// send ring and store the producer counter into the SQ doorbell; PostRecv writes 16-byte RX
// descriptors into the receive ring and stores the RQ doorbell. After each doorbell store the
// provider rings the device (engine.Ring): when no other goroutine is doing the device's work,
// the posting goroutine does it for that QP at once (its WQEs are executed and their datagrams
// sent before the post returns); otherwise the device's goroutine is woken. The device writes
// 32-byte completions with phase bits into the CQ ring; Poll and StartPoll/NextPoll/EndPoll read
// them by phase and report the consumer count through the CQ doorbell. A Poll or StartPoll that
// finds the CQ empty first lets the device take the datagrams waiting for it on the polling
// goroutine (busy polling: no handoff from the device's receive goroutine), so an empty poll of a
// networked device costs a system call. A program that writes the rings itself
// (efadv.QueryQPWQs, efadv.QueryCQ) goes through exactly the same memory.
//
// Request ids follow libefa: a send or receive WR takes an index from its queue's pool, and the
// WQE's 16-bit req_id is that index with the QP number's generation above it; a completion whose
// generation does not match, or that names an unknown QP, is consumed and reported as EINVAL.
// So is every entry a destroyed QP left in a CQ, its flush completions included, as libefa drops
// them (efa_poll_sub_cq finds no QP, or one of another generation, in its QP table): the QP's
// number may already belong to a new QP, which must not see them under its number. Each CQ marks
// where a destroyed QP's entries end (the producer count at the destroy), so the drop does not
// rest on the generation alone, which aliases after a few reuses (2^(16-log2 entries)
// generations) and is not in a 64-bit request id. To see a QP's last completions, poll before
// destroying it, or move it to ERR and poll its flushes first.
// With config.Device.RequestID64 the send queue carries the whole 64-bit wr_id in the WQE and the
// CQE instead. A send-queue slot frees when its completion is polled, not when the device is done
// with it: a full send queue is ENOMEM.
//
// # Concurrency
//
// As in libefa, posting and polling are safe from several goroutines. Each QP's send queue has a
// lock, taken by PostSend and held by a QPEx session from WRStart until WRComplete or WRAbort; its
// receive queue has another, taken by PostRecv. Each CQ has a lock taken by Poll and held from
// StartPoll until EndPoll (not taken for a CQ created with CreateCQSingleThreaded). The request-id
// pools have a small lock of their own, since posting takes ids and polling returns them. Modify
// and QP.Destroy take both queue locks (so a goroutine must end its own QPEx session before it
// destroys the QP, or the Destroy waits for ever). Control calls (create, modify, destroy) may run
// concurrently with the data path; the device serialises them with its own work.
//
// The device's goroutines (its engine loop and, on a network, its receive loop) and the posting
// and polling goroutines that do its work inline all do it under the device's own lock and never
// take a provider lock. Completion events are queued on the CQ's CompChannel without blocking;
// GetCQEvent waits for them and can be cancelled through its context.
//
// # Differences from C
//
// EFA has no SRQ, XRC, RSS, TSO, atomics, memory windows or parent domains; the Go structs leave
// those fields out, and asking for them by mask is EOPNOTSUPP or EINVAL as libefa answers.
// CQ.Destroy refuses with EBUSY, where C would block, while completion events are unacknowledged. An inline send through PostSend reads its SGEs through the
// registered regions of the context, so an SGE outside every region is EINVAL rather than a
// stray memory read. ToQPEx of a QP created without send-ops flags is EOPNOTSUPP where C returns
// NULL. ReadSLID is 16 bits wide, as WC.SLID is (C widens it to 32). Where C would crash or
// corrupt state, Go returns EINVAL: a nil argument (or nil QP to post on), a call on a destroyed
// QP, a second Destroy (Dealloc, Dereg) of an object, a send through an AH of another PD than the
// QP's. EndPoll without an open StartPoll session does nothing.
package verbs
