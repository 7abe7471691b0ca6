package srd

// reqTable holds a stream's outstanding requests by message id. Ids are handed out one after
// another (txStream.nextMsg) and requests mostly finish in the order they went, so a request goes
// in the slot its id names modulo the table's size, and one whose slot is taken (by a request a
// table's size of ids older, still outstanding) goes in a map beside it. A map for all of them,
// as before, hashed the key and grew and shrank its buckets for every message: a tenth of the CPU
// a 64-byte message cost its sender. The slots double when half full, and never shrink while the
// stream is in use (slimPeer lets go of the table with the rest of an idle peer's buffers: a
// slim peer's stream has none, nil, and txReady makes one).
type reqTable struct {
	slots []*Msg // len a power of two, or nil
	more  map[uint32]*Msg
	n     int
}

// reqsStart is the slots of a new table.
const reqsStart = 16

// get returns the request with id, or nil; a nil table holds none.
func (r *reqTable) get(id uint32) *Msg {
	if r == nil || r.slots == nil {
		return nil
	}
	if m := r.slots[id&uint32(len(r.slots)-1)]; m != nil && m.hdr.MsgID == id {
		return m
	}
	return r.more[id] // (nil map: nil)
}

// put adds m, whose id is not in the table.
func (r *reqTable) put(m *Msg) {
	if 2*(r.n+1) > len(r.slots) {
		r.grow()
	}
	r.place(m)
	r.n++
}

func (r *reqTable) place(m *Msg) {
	slot := &r.slots[m.hdr.MsgID&uint32(len(r.slots)-1)]
	if *slot == nil {
		*slot = m
		return
	}
	if r.more == nil {
		r.more = make(map[uint32]*Msg)
	}
	r.more[m.hdr.MsgID] = m
}

// remove takes out the request with id, if there is one.
func (r *reqTable) remove(id uint32) {
	if r == nil || r.slots == nil {
		return
	}
	if slot := &r.slots[id&uint32(len(r.slots)-1)]; *slot != nil && (*slot).hdr.MsgID == id {
		*slot = nil
		r.n--
		return
	}
	if _, ok := r.more[id]; ok {
		delete(r.more, id)
		r.n--
	}
}

func (r *reqTable) grow() {
	old, more := r.slots, r.more
	r.slots, r.more = make([]*Msg, max(2*len(old), reqsStart)), nil
	for _, m := range old {
		if m != nil {
			r.place(m)
		}
	}
	for _, m := range more {
		r.place(m)
	}
}

// len is how many requests the table holds.
func (r *reqTable) len() int {
	if r == nil {
		return 0
	}
	return r.n
}

// all appends every request in the table to out.
func (r *reqTable) all(out []*Msg) []*Msg {
	if r == nil {
		return out
	}
	for _, m := range r.slots {
		if m != nil {
			out = append(out, m)
		}
	}
	for _, m := range r.more {
		out = append(out, m)
	}
	return out
}
