package engine

import (
	"context"
	"sync"
)

// AsyncEvent is an unaffiliated or affiliated asynchronous event (ibv_async_event).
type AsyncEvent struct {
	Type int // uapi.Event*
	QP   *QP
	CQ   *CQ
}

// raise queues an event. Called with d.mu held.
func (d *Device) raise(ev AsyncEvent) {
	d.events = append(d.events, ev)
	select {
	case d.evNotify <- struct{}{}:
	default:
	}
}

// GetAsyncEvent waits for the next asynchronous event (ibv_get_async_event) or for ctx to end.
func (d *Device) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	for {
		d.mu.Lock()
		if len(d.events) > 0 {
			ev := d.events[0]
			d.events = d.events[1:]
			d.mu.Unlock()
			return ev, nil
		}
		closed := d.closed
		d.mu.Unlock()
		if closed {
			return AsyncEvent{}, ErrClosed
		}
		select {
		case <-d.evNotify:
		case <-d.done:
		case <-ctx.Done():
			return AsyncEvent{}, ctx.Err()
		}
	}
}

// pendingQueue is the list of QPs whose doorbells a provider rang with Ring, handed from any
// goroutine to the engine loop. Each QP is queued at most once (QP.kicked).
type pendingQueue struct {
	mu sync.Mutex
	q  []*QP
}

func (p *pendingQueue) push(q *QP) {
	p.mu.Lock()
	p.q = append(p.q, q)
	p.mu.Unlock()
}

// drain moves the queued QPs into buf (reused by the caller) and returns it.
func (p *pendingQueue) drain(buf []*QP) []*QP {
	p.mu.Lock()
	buf = append(buf[:0], p.q...)
	clear(p.q)
	p.q = p.q[:0]
	p.mu.Unlock()
	return buf
}
