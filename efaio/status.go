package efaio

import "strconv"

// Status is an EFA completion status (efa_io_comp_status), the byte at offset 2 of every CQE.
type Status uint8

// Completion statuses, with the values of efa_io_defs.h.
const (
	StatusOK                    Status = 0  // success
	StatusFlushed               Status = 1  // flushed during QP destroy or error
	StatusLocalQPInternalError  Status = 2  // internal QP error (also: malformed WQE)
	StatusLocalUnsupportedOp    Status = 3  // unsupported operation
	StatusLocalInvalidAH        Status = 4  // bad address handle
	StatusLocalInvalidLKey      Status = 5  // lkey not registered, or address outside its region
	StatusLocalBadLength        Status = 6  // message too long
	StatusRemoteBadAddress      Status = 7  // rkey or remote address bad
	StatusRemoteAbort           Status = 8  // connection reset by the remote side
	StatusRemoteBadDestQPN      Status = 9  // destination QP missing, in error, or qkey mismatch
	StatusRemoteRNR             Status = 10 // no receive WR posted on the remote QP
	StatusRemoteBadLength       Status = 11 // receiver's buffers too short
	StatusRemoteBadStatus       Status = 12 // unexpected status from the responder
	StatusLocalUnrespRemote     Status = 13 // remote stopped answering
	StatusRemoteUnknownPeer     Status = 14 // no valid AH at the remote side
	StatusLocalUnreachRemote    Status = 15 // remote never answered
	StatusRemoteFeatureMismatch Status = 18 // feature mismatch between the two sides
)

var statusNames = [...]string{
	StatusOK:                    "ok",
	StatusFlushed:               "flushed",
	StatusLocalQPInternalError:  "local QP internal error",
	StatusLocalUnsupportedOp:    "local unsupported operation",
	StatusLocalInvalidAH:        "local invalid AH",
	StatusLocalInvalidLKey:      "local invalid lkey",
	StatusLocalBadLength:        "local bad length",
	StatusRemoteBadAddress:      "remote bad address",
	StatusRemoteAbort:           "remote abort",
	StatusRemoteBadDestQPN:      "remote bad destination QPN",
	StatusRemoteRNR:             "remote receiver not ready",
	StatusRemoteBadLength:       "remote bad length",
	StatusRemoteBadStatus:       "remote bad status",
	StatusLocalUnrespRemote:     "remote unresponsive",
	StatusRemoteUnknownPeer:     "remote unknown peer",
	StatusLocalUnreachRemote:    "remote unreachable",
	StatusRemoteFeatureMismatch: "remote feature mismatch",
}

func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return "status " + strconv.Itoa(int(s))
}
