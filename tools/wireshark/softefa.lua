-- Wireshark dissector for softefa's SRD-over-UDP wire format, version 4 (docs/wire.md).
--
-- Load it with:  wireshark -X lua_script:tools/wireshark/softefa.lua
--           or:  tshark -X lua_script:tools/wireshark/softefa.lua -r capture.pcap
-- or copy it into your Wireshark plugins folder. It finds softefa datagrams on any UDP port by
-- their shape (a heuristic dissector); "softefa" is the display filter.
--
-- A capture on loopback sees a UDP GSO run as one packet holding several datagrams, which this
-- dissector does not take apart: run the devices with their offloads off while capturing there
-- (--no-offload, config.Device.NoOffload; docs/settings.md).

local p = Proto("softefa", "softefa SRD over UDP")

local frame_types = { [1] = "DATA", [2] = "ACK", [3] = "PROBE", [4] = "PROBE_ACK", [5] = "RESET",
  [6] = "CHALLENGE", [7] = "COOKIE" }
local ops = { [0] = "SEND", [1] = "READ_REQ", [2] = "WRITE", [3] = "READ_RESP", [4] = "RESP", [5] = "ABORT" }
local statuses = {
  [0] = "OK", [1] = "FLUSHED", [2] = "LOCAL_ERROR_QP_INTERNAL_ERROR", [3] = "LOCAL_ERROR_UNSUPPORTED_OP",
  [4] = "LOCAL_ERROR_INVALID_AH", [5] = "LOCAL_ERROR_INVALID_LKEY", [6] = "LOCAL_ERROR_BAD_LENGTH",
  [7] = "REMOTE_ERROR_BAD_ADDRESS", [8] = "REMOTE_ERROR_ABORT", [9] = "REMOTE_ERROR_BAD_DEST_QPN",
  [10] = "REMOTE_ERROR_RNR", [11] = "REMOTE_ERROR_BAD_LENGTH", [12] = "REMOTE_ERROR_BAD_STATUS",
  [13] = "LOCAL_ERROR_UNRESP_REMOTE", [14] = "REMOTE_ERROR_UNKNOWN_PEER", [15] = "LOCAL_ERROR_UNREACH_REMOTE",
  [18] = "REMOTE_ERROR_FEATURE_MISMATCH",
}

local f = {
  version   = ProtoField.uint8("softefa.version", "Version"),
  path      = ProtoField.uint8("softefa.path", "Path"),
  src_port  = ProtoField.uint16("softefa.src_port", "Source device port"),
  src_inc   = ProtoField.uint32("softefa.src_inc", "Source incarnation", base.HEX),
  dst_inc   = ProtoField.uint32("softefa.dst_inc", "Destination incarnation", base.HEX),
  tx_epoch  = ProtoField.uint16("softefa.tx_epoch", "Tx stream epoch"),
  rx_epoch  = ProtoField.uint16("softefa.rx_epoch", "Rx stream epoch"),
  checksum  = ProtoField.uint32("softefa.checksum", "Checksum (CRC-32C)", base.HEX),
  ftype     = ProtoField.uint8("softefa.frame.type", "Frame type", base.DEC, frame_types),
  fflags    = ProtoField.uint8("softefa.frame.flags", "Frame flags", base.HEX),
  flen      = ProtoField.uint16("softefa.frame.length", "Frame length"),
  psn       = ProtoField.uint32("softefa.data.psn", "PSN"),
  msg_id    = ProtoField.uint32("softefa.data.msg_id", "Message id"),
  offset    = ProtoField.uint32("softefa.data.offset", "Offset"),
  msg_len   = ProtoField.uint32("softefa.data.msg_len", "Message length"),
  op        = ProtoField.uint8("softefa.data.op", "Operation", base.DEC, ops),
  dflags    = ProtoField.uint8("softefa.data.flags", "Data flags", base.HEX),
  imm_flag  = ProtoField.bool("softefa.data.flags.imm", "Immediate", 8, nil, 0x01),
  ud_flag   = ProtoField.bool("softefa.data.flags.ud", "UD", 8, nil, 0x02),
  src_qpn   = ProtoField.uint16("softefa.data.src_qpn", "Source QPN"),
  dst_qpn   = ProtoField.uint16("softefa.data.dst_qpn", "Destination QPN"),
  status    = ProtoField.uint8("softefa.data.status", "Status", base.DEC, statuses),
  reserved  = ProtoField.uint8("softefa.data.reserved", "Reserved"),
  qkey      = ProtoField.uint32("softefa.data.qkey", "QKey", base.HEX),
  imm       = ProtoField.uint32("softefa.data.imm", "Immediate data", base.HEX),
  rkey      = ProtoField.uint32("softefa.data.rkey", "RKey", base.HEX),
  raddr     = ProtoField.uint64("softefa.data.raddr", "Remote address", base.HEX),
  payload   = ProtoField.bytes("softefa.data.payload", "Payload"),
  cum       = ProtoField.uint32("softefa.ack.cum", "Cumulative PSN"),
  highest   = ProtoField.uint32("softefa.ack.highest", "Highest PSN"),
  sack      = ProtoField.uint64("softefa.ack.sack", "Selective bits", base.HEX),
  ack_path  = ProtoField.uint8("softefa.ack.path", "Answered path"),
  ack_flags = ProtoField.uint8("softefa.ack.flags", "ACK flags", base.HEX),
  horizon   = ProtoField.uint32("softefa.ack.horizon", "Horizon PSN"),
  nonce     = ProtoField.uint32("softefa.probe.nonce", "Probe nonce", base.HEX),
  cookie    = ProtoField.uint64("softefa.cookie", "Cookie", base.HEX),
  port      = ProtoField.uint16("softefa.cookie.port", "Source port"),
}
p.fields = f

local function dissect_frame(buf, tree, off)
  local ftype = buf(off, 1):uint()
  local flen = buf(off + 2, 2):uint()
  local t = tree:add(p, buf(off, flen), "Frame: " .. (frame_types[ftype] or "unknown"))
  t:add(f.ftype, buf(off, 1))
  t:add(f.fflags, buf(off + 1, 1))
  t:add(f.flen, buf(off + 2, 2))
  local b = off + 4
  local summary = frame_types[ftype] or "?"
  if ftype == 1 and flen >= 48 then
    t:add(f.psn, buf(b, 4))
    t:add(f.msg_id, buf(b + 4, 4))
    t:add(f.offset, buf(b + 8, 4))
    t:add(f.msg_len, buf(b + 12, 4))
    t:add(f.op, buf(b + 16, 1))
    local fl = t:add(f.dflags, buf(b + 17, 1))
    fl:add(f.imm_flag, buf(b + 17, 1))
    fl:add(f.ud_flag, buf(b + 17, 1))
    t:add(f.src_qpn, buf(b + 18, 2))
    t:add(f.dst_qpn, buf(b + 20, 2))
    t:add(f.status, buf(b + 22, 1))
    t:add(f.reserved, buf(b + 23, 1))
    t:add(f.qkey, buf(b + 24, 4))
    t:add(f.imm, buf(b + 28, 4))
    t:add(f.rkey, buf(b + 32, 4))
    t:add(f.raddr, buf(b + 36, 8))
    if flen > 48 then t:add(f.payload, buf(b + 44, flen - 48)) end
    summary = (ops[buf(b + 16, 1):uint()] or "?") .. " psn=" .. buf(b, 4):uint()
  elseif ftype == 2 and flen == 52 then
    t:add(f.cum, buf(b, 4))
    t:add(f.highest, buf(b + 4, 4))
    for i = 0, 3 do t:add(f.sack, buf(b + 8 + 8 * i, 8)) end
    t:add(f.ack_path, buf(b + 40, 1))
    t:add(f.ack_flags, buf(b + 41, 1)) -- 1: the horizon 0 is PSN 0, not "none"
    t:add(f.horizon, buf(b + 44, 4))
    summary = "ACK cum=" .. buf(b, 4):uint()
  elseif (ftype == 3 or ftype == 4) and flen == 14 then
    t:add(f.nonce, buf(b, 4))
  elseif ftype == 6 and flen == 14 then
    t:add(f.cookie, buf(b, 8))
    t:add(f.port, buf(b + 8, 2))
  elseif ftype == 7 and flen >= 14 then
    t:add(f.cookie, buf(b, 8))
    for i = b + 8, off + flen - 2, 2 do t:add(f.port, buf(i, 2)) end
  end
  return flen, summary
end

local function dissect(buf, pinfo, tree)
  local n = buf:len()
  if n < 24 or buf(0, 1):uint() ~= 4 then return false end
  -- Every frame must fit exactly: that is what tells softefa from other UDP traffic.
  local off = 20
  while off < n do
    if n - off < 4 then return false end
    local flen = buf(off + 2, 2):uint()
    if flen < 4 or off + flen > n or buf(off + 1, 1):uint() ~= 0 or buf(off, 1):uint() > 7 then return false end
    off = off + flen
  end
  pinfo.cols.protocol = "softefa"
  local t = tree:add(p, buf(), "softefa SRD over UDP")
  t:add(f.version, buf(0, 1))
  t:add(f.path, buf(1, 1))
  t:add(f.src_port, buf(2, 2))
  t:add(f.src_inc, buf(4, 4))
  t:add(f.dst_inc, buf(8, 4))
  t:add(f.tx_epoch, buf(12, 2))
  t:add(f.rx_epoch, buf(14, 2))
  t:add(f.checksum, buf(16, 4))
  off = 20
  local parts = {}
  while off < n do
    local flen, s = dissect_frame(buf, t, off)
    parts[#parts + 1] = s
    off = off + flen
  end
  pinfo.cols.info = "path " .. buf(1, 1):uint() .. ": " .. table.concat(parts, ", ")
  return true
end

p:register_heuristic("udp", dissect)
