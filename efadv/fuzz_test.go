package efadv_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// FuzzRings writes arbitrary bytes into the SQ and RQ rings of live QPs and arbitrary producer
// counts into their doorbells. The device must turn whatever it finds into completions (or
// ignore it), never crash or hang, and keep carrying traffic for other QPs.
func FuzzRings(f *testing.F) {
	valid := make([]byte, 64)
	writeWQE(valid, 1, 0, 0, 3, 1, srdQKey, 0x101, 0, 8, 0, 0)
	f.Add(valid, []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 8, 0, 1, 1, 0, 0xc0}, uint16(1), uint16(1))
	f.Add(make([]byte, 64*3), make([]byte, 48), uint16(3), uint16(3))
	f.Add([]byte{0xff}, []byte{0xff}, uint16(0xffff), uint16(0x8000))
	f.Fuzz(func(t *testing.T, sqBytes, rqBytes []byte, sqDB, rqDB uint16) {
		synctest.Test(t, func(t *testing.T) {
			dev := newDevice(t, nil)
			o := srdOpts{qpCount: 1, msgSize: 4096, access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead,
				sendOps: verbs.SendOpsSend}
			client, server := pair(t, dev, o)
			sq, _, _ := efadv.QueryQPWQs(client.qps[0])
			_, rq, _ := efadv.QueryQPWQs(server.qps[0])
			for i, b := range sqBytes {
				sq.Buffer[i%len(sq.Buffer)] = b
			}
			for i, b := range rqBytes {
				rq.Buffer[i%len(rq.Buffer)] = b
			}
			check(t, efadv.RingDoorbell(server.qps[0], rq.Doorbell, uint32(rqDB)))
			check(t, efadv.RingDoorbell(client.qps[0], sq.Doorbell, uint32(sqDB)))
			time.Sleep(100 * time.Millisecond)

			// Other QPs on the device still work.
			a, b := pair(t, dev, srdOpts{qpCount: 1, msgSize: 64, sendOps: verbs.SendOpsSend})
			b.postRecv(b.qps[0])
			a.sendEx(0, verbs.WRSend)
			wantSuccess(t, waitWC(t, a.cq, 1))
			wantSuccess(t, waitWC(t, b.cq, 1))
		})
	})
}
