// Package srd is the Scalable Reliable Datagram transport of a software EFA device
// (docs/wire.md, docs/congestion.md): the peer contexts, their packet streams, acknowledgements,
// loss detection and retransmission, congestion windows, multipath, address validation, sealing
// and the peer table's bounds. The device above it (package engine) keeps the objects, memory,
// rings and work-request execution; the two meet at the interface below.
//
// Each pair of devices shares a peer context per side. A device's DATA frames to a peer form a
// packet stream: PSNs from 0 in each stream epoch, acknowledged cumulatively and selectively,
// retransmitted until acknowledged, delivered to the receiver exactly once (the receiver keeps a
// window of PSNs seen). Messages ride on that stream: a SEND or RDMA write is cut into segments
// that fit the path MTU; the responder places segments as they come, in any order, and answers a
// message that fails with a RESP frame carrying its status; an RDMA read is a READ_REQ answered
// by READ_RESP segments. RESP, READ_REQ and READ_RESP frames are in the streams too, so they are
// as reliable as data. A message succeeds when ACKs cover every segment and the peer's stream has
// reached the horizon the covering ACK named with no RESP for it (settle).
//
// # The interface with the device
//
// Down, from the device: a request to send (Transport.Request: a SEND, RDMA write or read with
// its source buffers or read sink, and an owner, the completion handle), a UD message
// (Transport.UD), a request's cancellation when its queue pair is flushed (Transport.Cancel),
// batches of datagrams from the link (Transport.Input), and the timer (Transport.Tick).
//
// Up, to the device (Host): the segments of arriving SENDs and writes to place
// (Host.Receive), arriving read requests to check (Host.Read), UD messages (Host.UD), and each
// request's outcome (Host.Done). The transport reads and writes application memory only through
// the host (Host.Gather, Host.Copy), which guards it against faults.
//
// # Ownership
//
// A Transport is not safe for concurrent use: the device calls every method with its own lock
// held, except Flush, which sends a Queue's datagrams after the caller let go of that lock (no
// lock is held across the system call), and AcksOwed. Each goroutine that does the device's work
// owns a Queue of its own, which Use makes the queue the frames go to. The clock is an argument of
// every call that frames or times anything (Input, Tick, FlushAcks, Request, UD, Frame): the device
// reads it once per batch, not per packet, and passes the reading to each call of the batch.
// Request only queues: the batch's requests are framed at its end, by Hold (one pump a stream
// for a whole doorbell's list), or earlier by Frame or FlushAcks. Input frames what a batch of
// received datagrams set going (answers, what an ACK after DATA lets out) once the batch is
// handled, so that an ACK riding with it covers whole datagrams (docs/congestion.md). Idle
// peers are slimmed on the timer (Tick), which the device keeps running while Busy or Lingering.
package srd
